#!/usr/bin/env python3
"""PyTorch twin of `textnet transformer`: the same character-level decoder-only Transformer (pre-LayerNorm
blocks of causal multi-head attention and a tanh-GELU MLP, learned position embeddings, a biased output
head), the same vocabulary, split, batches and validation windows, AdamW on every parameter, fp32, eager
mode, TF32 off (--tf32: TF32 products; --bf16: bf16 autocast over the forward pass and loss, fp32 weights,
as `textnet transformer --precision bf16`). Module names make `model.state_dict()` keys the tensor names of a textnet model file
(`tok_emb.weight`, `blocks.0.attn.qkv.weight`, ...), so --load evaluates one (heads from its metadata key
`heads`, else --heads; its vocabulary from the metadata key `vocab`, else rebuilt from the corpus).

Vocabulary: id 0 = unknown, ids 1.. = characters by descending count in the whole corpus, ties by code
point, at most --vocab ids in all. Train = the first floor(0.9 n) ids, validation = the rest. Each step
draws B offsets uniformly in [0, n_train - T - 1] with a torch.Generator seeded by --seed; the validation
loss is the mean over at most 256 windows at offsets i * max(T, (n_val - T - 1) // 256).

Timed: the training steps only, with CUDA events (wall clock on the CPU), after 3 untimed warm-up steps and
one evaluation whose updates are then undone. Each run of steps between two evaluations is a span of its
own; train_s sums the spans and the evaluations are timed apart (eval_s). Prints one JSON object.
--save writes the trained state_dict as safetensors (metadata: heads, block, vocab); --generate N
samples N characters after --prompt from the eager model (--temperature 0: always the likeliest).

usage: python3 benches/torch_transformer.py [CORPUS=corpus/shakespeare.txt] [--steps 1000] [--batch 32]
    [--block 64] [--embed 64] [--heads 4] [--layers 2] [--vocab 256] [--lr 1e-3] [--weight-decay 0.01]
    [--eval-every 100] [--seed 0] [--tf32] [--bf16] [--compile] [--attention manual|sdpa] [--device cuda|cpu]
    [--load MODEL.safetensors] [--save MODEL.safetensors] [--generate N] [--prompt "ROMEO:"] [--temperature 1]
larger shape: --layers 6 --heads 6 --embed 384 --block 256 --batch 64
"""
import argparse
import ctypes
import json
import math
import struct
import time
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

UNKNOWN = "\ufffd"


class Attention(nn.Module):
    def __init__(self, embed, heads, block, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)
        self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            y = F.softmax(s.masked_fill(~self.causal[:T, :T], float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.fc, self.proj = nn.Linear(embed, 4 * embed), nn.Linear(4 * embed, embed)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, embed, heads, block, sdpa):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed, eps=1e-5)
        self.attn = Attention(embed, heads, block, sdpa)
        self.ln2 = nn.LayerNorm(embed, eps=1e-5)
        self.mlp = Mlp(embed)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, block, embed, heads, layers, sdpa=False):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, embed), nn.Embedding(block, embed)
        self.blocks = nn.ModuleList(Block(embed, heads, block, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embed, eps=1e-5)
        self.head = nn.Linear(embed, vocab)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    meta, tensors = header.pop("__metadata__", None) or {}, {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}, not F32")
        start, end = info["data_offsets"]
        data = bytearray(raw[8 + size + start:8 + size + end])
        tensors[name] = torch.frombuffer(data, dtype=torch.float32).reshape(info["shape"]) if data else torch.zeros(info["shape"])
    return tensors, meta


def write_safetensors(path, state, meta):
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, t in state.items():
        t = t.detach().to("cpu", torch.float32).contiguous()
        blobs.append(ctypes.string_at(t.data_ptr(), t.numel() * 4))
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(blobs[-1])]}
        at += len(blobs[-1])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", default="corpus/shakespeare.txt")
    for flag, kind, default in [("--steps", int, 1000), ("--batch", int, 32), ("--block", int, 64), ("--embed", int, 64),
                                ("--heads", int, 4), ("--layers", int, 2), ("--vocab", int, 256), ("--lr", float, 1e-3),
                                ("--weight-decay", float, 0.01), ("--eval-every", int, 100), ("--seed", int, 0),
                                ("--generate", int, 0), ("--temperature", float, 1.0)]:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast around the forward pass and loss (fp32 weights)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--load", metavar="MODEL.safetensors")
    ap.add_argument("--save", metavar="MODEL.safetensors")
    ap.add_argument("--prompt", default="ROMEO:")
    a = ap.parse_args()
    dev, cuda = torch.device(a.device), a.device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32

    loaded, meta = read_safetensors(a.load) if a.load else (None, {})
    if loaded is not None:  # the file's shape wins over the flags
        a.vocab, a.embed = loaded["tok_emb.weight"].shape
        a.block = loaded["pos_emb.weight"].shape[0]
        a.layers = sum(1 for k in loaded if k.startswith("blocks.") and k.endswith(".ln1.weight"))
        a.heads = int(meta.get("heads", a.heads))
    if min(a.steps, a.batch, a.block, a.embed, a.heads, a.layers, a.eval_every) < 1 or a.vocab < 2:
        raise SystemExit("--steps, --batch, --block, --embed, --heads, --layers and --eval-every must be at least 1, --vocab at least 2")
    if a.embed % a.heads:
        raise SystemExit(f"--embed {a.embed} is not a multiple of --heads {a.heads}")

    with open(a.corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    vocabulary = json.loads(meta["vocab"]) if "vocab" in meta else None
    if vocabulary is None:
        counts = Counter(text)
        vocabulary = [UNKNOWN] + sorted(counts, key=lambda c: (-counts[c], ord(c)))[: a.vocab - 1]
    stoi = {c: i for i, c in enumerate(vocabulary) if i > 0}
    V, T, B = len(vocabulary) if loaded is None else a.vocab, a.block, a.batch
    ids = torch.tensor([stoi.get(c, 0) for c in text], dtype=torch.long)
    if len(vocabulary) > V:
        raise SystemExit(f"{a.load}: its vocabulary has {len(vocabulary)} entries but tok_emb.weight only {V} rows")
    n = len(ids)
    n_train = n * 9 // 10
    n_val = n - n_train
    if min(n_train, n_val) < T + 1:
        raise SystemExit(f"--block {T} is too large for this corpus: train has {n_train} ids, validation {n_val}, each needs block + 1")
    train, val = ids[:n_train].to(dev), ids[n_train:].to(dev)
    stride = max(T, (n_val - T - 1) // 256)
    val_offsets = torch.arange(0, n_val - T, stride)[:256].to(dev)  # i * stride + T + 1 <= n_val, i < 256
    window = torch.arange(T + 1, device=dev)

    torch.manual_seed(a.seed)
    model = Transformer(V, T, a.embed, a.heads, a.layers, a.attention == "sdpa").to(dev)
    if loaded is not None:
        model.load_state_dict(loaded)
    params = sum(p.numel() for p in model.parameters())

    @torch.no_grad()
    def evaluate(fwd, chunk=64):
        total = torch.zeros((), device=dev)
        for i in range(0, len(val_offsets), chunk):
            w = val[val_offsets[i:i + chunk, None] + window]
            with autocast():
                total += F.cross_entropy(fwd(w[:, :-1]).flatten(0, 1).float(), w[:, 1:].flatten(), reduction="sum")
        return total.item() / (len(val_offsets) * T)

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16)

    def step(fwd, opt, gen):
        w = train[torch.randint(0, n_train - T, (B, 1), device=dev, generator=gen) + window]
        with autocast():
            loss = F.cross_entropy(fwd(w[:, :-1]).flatten(0, 1), w[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def adamw():
        return torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)

    def mark():
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(start, end):
        return end - start if not cuda else start.elapsed_time(end) / 1e3

    report = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__, "mode": "eager",
              "tf32": a.tf32, "bf16": a.bf16, "attention": a.attention, "corpus": a.corpus,
              "config": {"vocab": V, "vocab_cap": a.vocab, "block": T, "embed": a.embed, "heads": a.heads, "layers": a.layers,
                         "ffn": 4 * a.embed, "batch": B, "steps": a.steps, "lr": a.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                         "weight_decay": a.weight_decay, "eval_every": a.eval_every, "seed": a.seed},
              "params": params, "n_train": n_train, "n_val": n_val, "val_windows": len(val_offsets)}
    fwd = model
    if loaded is not None:
        for k in ("batch", "steps", "lr", "betas", "eps", "weight_decay", "eval_every"):
            del report["config"][k]
        report.update(load=a.load, metadata={k: v for k, v in meta.items() if k != "vocab"}, val_loss=evaluate(model))
    else:
        initial = {k: v.clone() for k, v in model.state_dict().items()}

        def warm_up(fwd):  # 3 steps and one evaluation, on a generator of their own
            warm = adamw()
            for _ in range(3):
                step(fwd, warm, torch.Generator(device=dev).manual_seed(a.seed + 1))
            evaluate(fwd)

        if a.compile:
            try:
                fwd = torch.compile(model)
                warm_up(fwd)
                report["mode"] = "compiled"
            except Exception as e:  # report it and go on in eager mode
                report["compile_error"] = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
                fwd = model
        if fwd is model:
            warm_up(model)
        model.load_state_dict(initial)  # undo the warm-up's updates
        opt, gen = adamw(), torch.Generator(device=dev).manual_seed(a.seed)
        if cuda:
            torch.cuda.synchronize()
        evals, train_s, eval_s, loss_sum, since = [], 0.0, 0.0, torch.zeros((), device=dev), 0
        wall = time.perf_counter()
        start = mark()
        for s in range(1, a.steps + 1):
            loss = step(fwd, opt, gen)
            loss_sum += loss
            since += 1
            if s % a.eval_every == 0 or s == a.steps:
                end = mark()
                val_loss = evaluate(fwd)
                restart = mark()
                train_s += span(start, end)
                eval_s += span(end, restart)
                evals.append({"step": s, "train_loss": loss_sum.item() / since, "val_loss": val_loss})
                loss_sum, since, start = torch.zeros((), device=dev), 0, restart
        if cuda:
            torch.cuda.synchronize()
        report.update(
            timing="train_s: CUDA events (CPU: wall clock) around each run of training steps between two evaluations, summed; "
                   "the evaluations are timed the same way apart (eval_s); wall_s: wall clock over the whole loop",
            steps=a.steps, train_s=train_s, eval_s=eval_s, wall_s=time.perf_counter() - wall,
            tokens_per_s=a.steps * B * T / train_s, ms_per_step=1e3 * train_s / a.steps, evals=evals,
            final_train_loss=loss.item(), final_val_loss=evals[-1]["val_loss"])
        if a.save:
            write_safetensors(a.save, model.state_dict(), {"source": "benches/torch_transformer.py", "heads": str(a.heads),
                                                           "block": str(T), "vocab": json.dumps(vocabulary)})
            report["saved"] = a.save
    if a.generate > 0:
        sampler = torch.Generator(device=dev).manual_seed(a.seed)
        x = torch.tensor([[stoi.get(c, 0) for c in a.prompt] or [0]], device=dev)
        with torch.no_grad():
            for _ in range(a.generate):
                logits = model(x[:, -T:])[0, -1]
                if a.temperature == 0:
                    nxt = logits.argmax().view(1)
                else:
                    nxt = torch.multinomial(F.softmax(logits / a.temperature, dim=-1), 1, generator=sampler)
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
        report.update(prompt=a.prompt, temperature=a.temperature,
                      generated="".join(vocabulary[i] for i in x[0, -a.generate:].tolist()))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
