#!/usr/bin/env python3
"""PyTorch's causal attention at nanoGPT's shape (batch 64, 6 heads of 64, block 256) in bf16, through
scaled_dot_product_attention on its flash backend: forward alone and forward + backward, for side-by-side
timing with `textnet bench transformer --attention` on the same GPU.

Each figure is the median of 5 runs of 20 iterations between CUDA events, after a warm-up. FLOPs as the
textnet bench counts them: 4·HS per causal pair (t, u ≤ t) forward, 2.5 times that backward.

usage: python3 benches/torch_attention.py [--batch 64] [--heads 6] [--block 256] [--head-size 64]
Prints one JSON object.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, iterations=20, runs=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iterations)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--head-size", type=int, default=64)
    args = parser.parse_args()
    b, h, t, hs = args.batch, args.heads, args.block, args.head_size
    torch.manual_seed(1)
    shape = (b, h, t, hs)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), dy)

        forward_ms = median_ms(forward)
        both_ms = median_ms(forward_backward)
    forward_flops = 4.0 * hs * b * h * t * (t + 1) / 2
    backward_ms = both_ms - forward_ms
    print(json.dumps({
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"batch": b, "heads": h, "block": t, "head_size": hs, "dtype": "bfloat16", "causal": True},
        "backend": "scaled_dot_product_attention, flash",
        "forward_ms": forward_ms,
        "forward_backward_ms": both_ms,
        "backward_ms": backward_ms,
        "forward_tflops": forward_flops / (forward_ms * 1e-3) / 1e12,
        "backward_tflops": 2.5 * forward_flops / (backward_ms * 1e-3) / 1e12,
        "timing": "median of 5 runs of 20 iterations between CUDA events; backward = (forward + backward) - forward",
    }, indent=2))


if __name__ == "__main__":
    main()
