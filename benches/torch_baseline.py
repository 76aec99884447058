#!/usr/bin/env python3
"""PyTorch baseline for `textnet bench`: the same text model (mean of N context embeddings -> Linear(D,H)
-> ReLU -> Linear(H,V) -> softmax cross-entropy, plain SGD) at V=8192, D=64, H=256, N=3, fp32.

Modes: batch 1 eager, batch 1 with the whole training step captured in a CUDA graph, batch 256 and
batch 4096 eager. Timed with CUDA events after warm-up; the median of several repeats. Prints one JSON
object. Run it in the same device session as `textnet bench --json` so the numbers compare.

usage: python3 benches/torch_baseline.py [--repeats 7]
"""
import argparse
import json
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, H, N = 8192, 64, 256, 3


class TextModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        self.hidden = nn.Linear(D, H)
        self.out = nn.Linear(H, V)
        nn.init.xavier_uniform_(self.hidden.weight)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.hidden.bias)
        nn.init.zeros_(self.out.bias)

    def forward(self, context):
        x = self.embedding(context).mean(dim=1)
        return self.out(F.relu(self.hidden(x)))


def batches(batch, steps, gen):
    ctx = torch.randint(0, V, (steps, batch, N), device="cuda", generator=gen)
    tgt = torch.randint(0, V, (steps, batch), device="cuda", generator=gen)
    return ctx, tgt


def time_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def eager(batch, steps, repeats, gen):
    model = TextModel().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx, tgt = batches(batch, steps, gen)

    def run():
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(ctx[i]), tgt[i]).backward()
            opt.step()

    run()  # warm-up
    return time_ms(run, repeats)


def graphed(batch, steps, repeats, gen):
    model = TextModel().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx, tgt = batches(batch, steps, gen)
    static_ctx, static_tgt = ctx[0].clone(), tgt[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_ctx), static_tgt).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = F.cross_entropy(model(static_ctx), static_tgt)
        loss.backward()
        opt.step()

    def run():
        for i in range(steps):
            static_ctx.copy_(ctx[i])
            static_tgt.copy_(tgt[i])
            graph.replay()

    run()
    return time_ms(run, repeats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for mode, batch, steps, fn in [
        ("batch 1 eager", 1, 500, eager),
        ("batch 1 CUDA graph", 1, 5000, graphed),
        ("batch 256 eager", 256, 200, eager),
        ("batch 4096 eager", 4096, 50, eager),
    ]:
        times = fn(batch, steps, args.repeats, gen)
        med = statistics.median(times)
        rows.append({
            "mode": mode, "batch": batch, "steps": steps, "median_ms": med,
            "steps_per_s": steps / (med / 1e3), "samples_per_s": batch * steps / (med / 1e3),
            "repeats_ms": times,
        })
        print(f"# {mode}: {steps / (med / 1e3):,.0f} steps/s, {batch * steps / (med / 1e3):,.0f} samples/s", flush=True)
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "shape": {"vocab": V, "embed": D, "hidden": H, "context": N}, "rows": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
