#!/usr/bin/env python3
"""Keras's `mnist_convnet` example in PyTorch on the CPU, timed in training samples per second: the twin of
`scripts/textnet_convnet_cpu.py` for `scripts/convnet_cpu_compare.sh`.

The network is the example's: Conv2D(32, 3, relu) -> MaxPool(2) -> Conv2D(64, 3, relu) -> MaxPool(2) ->
Flatten -> Dropout(0.5) -> Dense(10, softmax), on 28x28x1 images, batch 128, Adam (lr 1e-3); the softmax
is folded into the cross-entropy, as textnet's loss folds it. The images are seeded random draws (the
speed does not depend on the pixels), each epoch's batches gathered in a fresh random order, as `fit`
gathers its shuffled batches. `--warmup` steps run first, untimed; then `--batches` steps are timed.

usage: python3 scripts/torch_convnet_cpu.py [--batches 50] [--warmup 5] [--batch 128] [--threads N]
Prints one JSON object: samples_per_s, seconds, batches, batch, threads, torch's version.
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(1600, 10),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if min(args.batches, args.batch, args.threads) < 1 or args.warmup < 0:
        ap.error("--batches, --batch and --threads must be at least 1, --warmup at least 0")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    samples = args.batches * args.batch
    images = torch.randn(samples, 1, 28, 28)
    labels = torch.randint(0, 10, (samples,))
    model = convnet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()

    def steps(count: int) -> float:
        order = torch.randperm(samples)
        last = 0.0
        for step in range(count):
            rows = order[(step * args.batch) % samples:][:args.batch]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images[rows]), labels[rows])
            loss.backward()
            optimizer.step()
            last = loss.item()
        return last

    steps(args.warmup)
    started = time.perf_counter()
    steps(args.batches)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "framework": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "batches": args.batches,
        "seconds": seconds,
        "samples_per_s": args.batches * args.batch / seconds,
    }))


if __name__ == "__main__":
    main()
