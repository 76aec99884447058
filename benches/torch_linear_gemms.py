# cuBLAS (through torch.mm) on the Transformer's linear products at nanoGPT's shape, fp32 (TF32 off) and bf16:
# forward y = x·Wᵀ, dW = dyᵀ·x and dx = dy·W of each layer, median of 30 after 5 warm-ups, one JSON line a
# dtype and layer. usage: python3 benches/torch_linear_gemms.py
import torch, sys, json
torch.backends.cuda.matmul.allow_tf32 = False
M = 16384
layers = [("qkv", 384, 1152), ("attn_proj", 384, 384), ("fc", 384, 1536), ("mlp_proj", 1536, 384), ("head", 384, 65)]
def timed(f, reps=30):
    for _ in range(5): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]
for dt in (torch.float32, torch.bfloat16):
    for name, i, o in layers:
        x = torch.randn(M, i, device="cuda", dtype=dt); W = torch.randn(o, i, device="cuda", dtype=dt)
        dy = torch.randn(M, o, device="cuda", dtype=dt)
        fl = 2 * M * i * o
        r = {"dtype": str(dt), "layer": name}
        for what, f in (("fwd", lambda: x @ W.t()), ("dW", lambda: dy.t() @ x), ("dx", lambda: dy @ W)):
            ms = timed(f); r[what + "_ms"] = round(ms, 4); r[what + "_tflops"] = round(fl / ms / 1e9, 1)
        print(json.dumps(r), flush=True)
