#!/usr/bin/env python3
"""PyTorch twin of `textnet bench matmul`: C = A @ B for square fp32 matrices (1024 by default) with uniform
inputs in [-1, 1), timed with CUDA events (wall clock on the CPU) over 10 back-to-back products per repeat
after a warm-up, median of the repeats. Two rows: fp32 with TF32 off (the same arithmetic as the textnet
kernels and cuBLAS sgemm), and TF32 on, labelled as such (10-bit mantissa inputs: faster, not comparable).
Each row's relative error against an fp64 product is reported. Prints one JSON object.

usage: python3 benches/torch_matmul.py [--device cuda|cpu] [--size 1024] [--repeats 7] [--seed 1]
"""
import argparse
import json
import statistics
import time

import torch

LAUNCHES = 10


def timed(fn, cuda, repeats):
    fn()  # warm-up
    ms = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        wall = time.perf_counter()
        for _ in range(LAUNCHES):
            fn()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            ms.append(start.elapsed_time(end) / LAUNCHES)
        else:
            ms.append((time.perf_counter() - wall) * 1e3 / LAUNCHES)
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    n = a.size
    g = torch.Generator().manual_seed(a.seed)
    a_host = torch.rand(n, n, generator=g) * 2 - 1
    b_host = torch.rand(n, n, generator=g) * 2 - 1
    want = a_host.double() @ b_host.double()
    x, y = a_host.to(a.device), b_host.to(a.device)
    out = torch.empty(n, n, device=a.device)
    flop = 2.0 * n ** 3
    rows = []
    modes = [("fp32", False), ("tf32", True)] if cuda else [("fp32", False)]
    for label, tf32 in modes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ms = timed(lambda: torch.matmul(x, y, out=out), cuda, max(1, a.repeats))
        got = out.double().cpu()
        med = statistics.median(ms)
        rows.append({
            "kernel": f"torch.matmul {label}", "tf32": tf32, "ms_median": med, "ms": ms,
            "tflops": flop / (med * 1e-3) / 1e12,
            "rel_error_vs_fp64": float((got - want).norm() / want.norm()),
        })
    torch.backends.cuda.matmul.allow_tf32 = False
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "device": torch.cuda.get_device_name() if cuda else "cpu",
        "m": n, "n": n, "k": n, "launches_per_repeat": LAUNCHES, "rows": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
