#!/usr/bin/env python3
"""PyTorch baseline for `textnet bench`: the same text model (mean of N context embeddings -> Linear(D,H)
-> ReLU -> Linear(H,V) -> softmax cross-entropy, plain SGD) at V=8192, D=64, H=256, N=3, fp32.

Modes: batch 1 eager, batch 1 with the whole training step captured in a CUDA graph, batch 256 and
batch 4096 eager. Timed with CUDA events after warm-up; the median of several repeats. Prints one JSON
object. Run it in the same device session as `textnet bench --json` so the numbers compare.

With --quality DIR (written by `textnet bench quality`): the same single-sample SGD run as textnet's,
from textnet's initial parameters over textnet's sample order, then validation loss and top-1/top-5 on
textnet's held-out samples, so the three implementations (GPU kernels, CPU reference, PyTorch) compare
sample for sample.

usage: python3 benches/torch_baseline.py [--repeats 7] [--quality DIR [--lr 0.05]]
"""
import argparse
import json
import statistics
import sys

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


def quality(directory, lr):
    import numpy as np
    from safetensors.torch import load_file

    def words(name):
        return torch.from_numpy(np.fromfile(f"{directory}/{name}", dtype="<u4").astype(np.int64)).cuda()

    tokens, order, val = words("tokens.u32"), words("order.u32"), words("val.u32")
    init = load_file(f"{directory}/init.safetensors")
    vocab, embed = init["embedding"].shape
    hidden = init["w1"].shape[0]
    emb = nn.Embedding(vocab, embed).cuda()
    lin1, lin2 = nn.Linear(embed, hidden).cuda(), nn.Linear(hidden, vocab).cuda()
    with torch.no_grad():
        emb.weight.copy_(init["embedding"])
        lin1.weight.copy_(init["w1"]); lin1.bias.copy_(init["b1"])
        lin2.weight.copy_(init["w2"]); lin2.bias.copy_(init["b2"])
    params = list(emb.parameters()) + list(lin1.parameters()) + list(lin2.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    offsets = torch.arange(-N, 0, device="cuda")

    def logits_of(positions):
        x = emb(tokens[positions[:, None] + offsets]).mean(dim=1)
        return lin2(F.relu(lin1(x)))

    train_loss = 0.0
    losses = torch.zeros(len(order), device="cuda")
    for i in range(len(order)):
        opt.zero_grad(set_to_none=True)
        pos = order[i:i + 1]
        loss = F.cross_entropy(logits_of(pos), tokens[pos])
        loss.backward()
        opt.step()
        losses[i] = loss.detach()
    train_loss = losses.mean().item()
    with torch.no_grad():
        total, top1, top5 = 0.0, 0, 0
        for chunk in val.split(1024):
            logits = logits_of(chunk)
            target = tokens[chunk]
            total += F.cross_entropy(logits, target, reduction="sum").item()
            best = logits.topk(5, dim=1).indices
            top1 += (best[:, 0] == target).sum().item()
            top5 += (best == target[:, None]).any(dim=1).sum().item()
    n = len(val)
    print(json.dumps({"torch": torch.__version__, "samples": len(order), "lr": lr, "train_loss": train_loss,
                      "val_loss": total / n, "top1_percent": 100 * top1 / n, "top5_percent": 100 * top5 / n}, indent=2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quality", metavar="DIR")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    if args.quality:
        return quality(args.quality, args.lr)
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
        print(f"# {mode}: {steps / (med / 1e3):,.0f} steps/s, {batch * steps / (med / 1e3):,.0f} samples/s",
              file=sys.stderr, flush=True)
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "shape": {"vocab": V, "embed": D, "hidden": H, "context": N}, "rows": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
