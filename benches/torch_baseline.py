#!/usr/bin/env python3
"""PyTorch baseline for `textnet bench`: the same text model (mean of N context embeddings -> Linear(D,H)
-> ReLU -> Linear(H,V) -> softmax cross-entropy, plain SGD) at V=8192, D=64, H=256, N=3, fp32.

Modes: batch 1 eager, batch 1 with the whole training step captured in a CUDA graph, batch 256 and
batch 4096 eager, and those two under bf16 autocast (the twin of `--precision bf16`). Timed with CUDA
events after warm-up; the median of several repeats. Prints one JSON object. Run it on the same
machine right after `textnet bench --json` so the numbers compare.

With --quality DIR... (each written by `textnet bench quality`): the same SGD run as textnet's (its
batch, rate and precision from the dump's run.json; bf16 as autocast), from textnet's initial
parameters over textnet's sample order, then validation loss and top-1/top-5 on textnet's held-out
samples, so the three implementations (GPU kernels, CPU reference,
PyTorch) compare sample for sample. One JSON object per directory, one per line (JSON Lines), with "dir"
and, for a directory named ...seed<N>, "seed": N. --quality-mode graph (the default) captures the
training step (gather the context, forward, cross-entropy, backward, SGD step) once in a CUDA graph and
replays it per sample, the same ops as eager, many times as fast (batches of more than one sample run
eager); --quality-mode eager runs it as plain PyTorch code. --quality-check also runs the first directory in the other mode and adds a
line {"check": "graph vs eager", ...} with both validation losses.

usage: python3 benches/torch_baseline.py [--repeats 7]
       python3 benches/torch_baseline.py --quality DIR [DIR ...] [--lr RATE] [--quality-mode graph|eager]
                                         [--quality-check]
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

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


def eager(batch, steps, repeats, gen, bf16=False):
    """Plain PyTorch steps; with bf16, the forward under bf16 autocast (fp32 weights and SGD)."""
    model = TextModel().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx, tgt = batches(batch, steps, gen)

    def run():
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(ctx[i]), tgt[i])
            loss.backward()
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


def seed_of(directory):
    """N when the directory's name ends in `seed<N>` (data/quality-seed7 -> 7), else None."""
    m = re.search(r"seed(\d+)$", os.path.basename(os.path.normpath(directory)))
    return int(m.group(1)) if m else None


def quality(directory, lr, mode="graph", device="cuda"):
    """Repeats `textnet bench quality`'s run from the dump in `directory`; returns the result as a dict.

    eager: one step after another as plain PyTorch code. graph: the same step (the same ops and the same
    SGD) captured once in a CUDA graph over static tensors and replayed per sample; off the GPU (the
    hidden --quality-device cpu, for testing) the same static step is called directly instead."""
    import numpy as np
    from safetensors.torch import load_file

    started = time.perf_counter()

    def words(name):
        data = np.fromfile(os.path.join(directory, name), dtype="<u4").astype(np.int64)
        return torch.from_numpy(data).to(device)

    tokens, order, val = words("tokens.u32"), words("order.u32"), words("val.u32")
    # The run's batch, rate and precision (older dumps: single samples at --lr, fp32).
    run_path = os.path.join(directory, "run.json")
    run_cfg = json.load(open(run_path)) if os.path.exists(run_path) else {}
    batch, bf16 = run_cfg.get("batch", 1), run_cfg.get("precision", "fp32") == "bf16"
    lr = run_cfg.get("lr", 0.05) if lr is None else lr
    if batch > 1 and mode == "graph":
        mode = "eager"  # the graph mode replays a single-sample step
    init = load_file(os.path.join(directory, "init.safetensors"))
    vocab, embed = init["embedding"].shape
    hidden = init["w1"].shape[0]
    emb = nn.Embedding(vocab, embed).to(device)
    lin1, lin2 = nn.Linear(embed, hidden).to(device), nn.Linear(hidden, vocab).to(device)
    with torch.no_grad():
        emb.weight.copy_(init["embedding"])
        lin1.weight.copy_(init["w1"]); lin1.bias.copy_(init["b1"])
        lin2.weight.copy_(init["w2"]); lin2.bias.copy_(init["b2"])
    params = list(emb.parameters()) + list(lin1.parameters()) + list(lin2.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    offsets = torch.arange(-N, 0, device=device)

    def logits_of(positions):
        x = emb(tokens[positions[:, None] + offsets]).mean(dim=1)
        return lin2(F.relu(lin1(x)))

    losses = torch.zeros(len(order), device=device)
    if mode == "eager":
        for i in range(0, len(order), batch):
            opt.zero_grad(set_to_none=True)
            pos = order[i:i + batch]
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(logits_of(pos), tokens[pos])
            loss.backward()
            opt.step()
            losses[i:i + batch] = loss.detach()
    elif mode == "graph":
        # Static inputs and grads: the sample's position is copied into static_pos before each replay,
        # and the grads stay allocated (zeroed in place, then accumulated into by backward in place), so
        # every replay reads and writes the same memory. 0 + g == g, so the update is the eager one's.
        static_pos = order[:1].clone()
        for p in params:
            p.grad = torch.zeros_like(p)

        def step():
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(logits_of(static_pos), tokens[static_pos])
            loss.backward()
            opt.step()
            return loss.detach()

        # The warm-up steps (PyTorch's whole-network capture recipe) train on static_pos: the initial
        # parameters are put back exactly before the first real step.
        initial = [p.detach().clone() for p in params]
        if device == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_loss = step()
            run = graph.replay
        else:
            for _ in range(3):
                step()
            static_loss = torch.zeros((), device=device)

            def run():
                static_loss.copy_(step())
        with torch.no_grad():
            for p, p0 in zip(params, initial):
                p.copy_(p0)
        del initial
        for i in range(len(order)):
            static_pos.copy_(order[i:i + 1])  # device to device: no host sync per step
            run()
            losses[i] = static_loss
    else:
        raise ValueError(f"unknown mode {mode!r}")
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
    result = {"dir": directory}
    if seed_of(directory) is not None:
        result["seed"] = seed_of(directory)
    result.update({"torch": torch.__version__, "mode": mode, "samples": len(order), "lr": lr, "batch": batch,
                   "precision": "bf16" if bf16 else "fp32",
                   "train_loss": train_loss, "val_loss": total / n, "top1_percent": 100 * top1 / n,
                   "top5_percent": 100 * top5 / n, "seconds": time.perf_counter() - started})
    return result


def qualities(dirs, lr, mode, device, check):
    """Runs `quality` on each directory in turn and prints one JSON line each (JSON Lines); a directory
    that fails (a textnet run that wrote no dump) prints a line with "error" and the others go on. With
    `check`, the first directory is run in both modes and a line compares them. Returns the exit code."""
    status = 0
    for k, directory in enumerate(dirs):
        compare = None
        try:
            result = quality(directory, lr, mode, device)
        except Exception as e:  # noqa: BLE001 -- one bad directory must not lose the others
            status = 1
            result = {"dir": directory, "error": f"{type(e).__name__}: {e}"}
            if seed_of(directory) is not None:
                result["seed"] = seed_of(directory)
            print(f"# {directory}: {result['error']}", file=sys.stderr, flush=True)
        if check and k == 0 and "error" not in result:
            try:
                other = quality(directory, lr, "eager" if mode == "graph" else "graph", device)
                eager, graph = (result, other) if mode == "eager" else (other, result)
                compare = {"check": "graph vs eager", "dir": directory,
                           "eager_val_loss": eager["val_loss"], "graph_val_loss": graph["val_loss"],
                           "abs_diff": abs(eager["val_loss"] - graph["val_loss"]),
                           "eager_train_loss": eager["train_loss"], "graph_train_loss": graph["train_loss"],
                           "eager_seconds": eager["seconds"], "graph_seconds": graph["seconds"]}
            except Exception as e:  # noqa: BLE001 -- the run itself stands
                status = 1
                compare = {"check": "graph vs eager", "dir": directory, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)
        if compare is not None:
            print(json.dumps(compare), flush=True)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quality", metavar="DIR", nargs="+")
    ap.add_argument("--lr", type=float, default=None, help="the dump's run.json rate (else 0.05) by default")
    ap.add_argument("--quality-mode", choices=["graph", "eager"], default="graph")
    ap.add_argument("--quality-check", action="store_true",
                    help="also run the first DIR in the other mode and print both validation losses")
    ap.add_argument("--quality-device", default="cuda", help=argparse.SUPPRESS)  # cpu: tests without a GPU
    args = ap.parse_args()
    if args.quality:
        return qualities(args.quality, args.lr, args.quality_mode, args.quality_device, args.quality_check)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for mode, batch, steps, fn in [
        ("batch 1 eager", 1, 500, eager),
        ("batch 1 CUDA graph", 1, 5000, graphed),
        ("batch 256 eager", 256, 200, eager),
        ("batch 4096 eager", 4096, 50, eager),
        ("batch 256 bf16 autocast eager", 256, 200, lambda *a: eager(*a, bf16=True)),
        ("batch 4096 bf16 autocast eager", 4096, 50, lambda *a: eager(*a, bf16=True)),
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
    sys.exit(main())
