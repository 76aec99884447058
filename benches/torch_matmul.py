#!/usr/bin/env python3
"""PyTorch twin of `textnet bench matmul`: C = A @ B for square fp32 matrices (1024 by default) with uniform
inputs in [-1, 1), timed with CUDA events (wall clock on the CPU) over 10 back-to-back products per repeat
after a warm-up, median of the repeats. Two rows: fp32 with TF32 off (the same arithmetic as the textnet
kernels and cuBLAS sgemm), and TF32 on, labelled as such (10-bit mantissa inputs: faster, not comparable).
Each row's relative error against an fp64 product is reported.

On CUDA, bf16 rows beside `textnet bench matmul`'s: torch.matmul on bf16 tensors (TF32 off) at 1024³ and
4096³, fp32 output where torch.mm takes out_dtype (else bf16 output, labelled so), and the Transformer's
linear-layer products at nanoGPT's and GPT-2-small's shapes (16384 rows, widths 384 and 768: forward in·Wᵀ,
dx = dy·W, dW = dyᵀ·x),
each error against the fp64 product of the bf16-rounded operands. Prints one JSON object.

usage: python3 benches/torch_matmul.py [--device cuda|cpu] [--size 1024] [--repeats 7] [--seed 1]
                                       [--bf16-sizes 1024,4096]
"""
import argparse
import json
import statistics
import time

import torch

LAUNCHES = 10
ROWS, WIDTHS = 16384, (384, 768)


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


def bf16_product(x, y):
    """x @ y for bf16 x, y with fp32 sums: fp32 output where torch.mm takes out_dtype, else bf16."""
    try:
        torch.mm(x[:1, :1], y[:1, :1], out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return (lambda: torch.matmul(x, y)), "bf16"
    return (lambda: torch.mm(x, y, out_dtype=torch.float32)), "fp32"


def bf16_row(label, x, y, repeats):
    """Times x @ y (x M×K, y K×N views in any layout, bf16 on the GPU) against the fp64 product."""
    fn, out = bf16_product(x, y)
    ms = timed(fn, True, repeats)
    want = x.double().cpu() @ y.double().cpu()
    got = fn().double().cpu()
    med = statistics.median(ms)
    (m, k), n = x.shape, y.shape[1]
    return {
        "kernel": f"torch.matmul bf16 {label}", "m": m, "n": n, "k": k, "output": out, "ms_median": med, "ms": ms,
        "tflops": 2.0 * m * n * k / (med * 1e-3) / 1e12,
        "rel_error_vs_fp64": float((got - want).norm() / want.norm()),
    }


def bf16_rows(sizes, seed, repeats):
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(seed)
    uniform = lambda *shape: (torch.rand(*shape, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    rows = []
    for n in sizes:
        rows.append(bf16_row(f"{n}³", uniform(n, n), uniform(n, n), repeats))
    # The linear layers' products, operands laid out as the layers hold them (W: out × in, activations:
    # rows × features), so the transposes are views, as in autograd.
    layers = [(c, o) for w in WIDTHS for c, o in [(w, 3 * w), (w, w), (w, 4 * w), (4 * w, w), (w, 65)]]
    for inputs, outputs in layers:
        x, w, dy = uniform(ROWS, inputs), uniform(outputs, inputs), uniform(ROWS, outputs)
        rows.append(bf16_row(f"forward {ROWS}×{outputs}×{inputs}", x, w.t(), repeats))
        rows.append(bf16_row(f"dx {ROWS}×{inputs}×{outputs}", dy, w, repeats))
        # dW = dyᵀ·[x | 1]: textnet's gradient tiles take the bias as an extra column of ones.
        rows.append(bf16_row(f"dW {outputs}×{inputs + 1}×{ROWS}", dy.t(), uniform(ROWS, inputs + 1), repeats))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bf16-sizes", default="1024,4096", help="sides of the square bf16 products (CUDA only)")
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
    sizes = [int(s) for s in a.bf16_sizes.split(",") if s]
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "device": torch.cuda.get_device_name() if cuda else "cpu",
        "m": n, "n": n, "k": n, "launches_per_repeat": LAUNCHES, "rows": rows,
        "bf16_rows": bf16_rows(sizes, a.seed, max(1, a.repeats)) if cuda else [],
    }, indent=2))


if __name__ == "__main__":
    main()
