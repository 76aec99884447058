#!/usr/bin/env python3
"""Where examples/mnist_resnet.py's training step spends its time on a GPU. Its model and compiled step
(forward, cross-entropy, backward, Adam), batch 128, timed three ways over --steps steps, each after a
warm-up, in rounds:
  replay   the compiled step on one batch already on the GPU, back to back: the GPU's time a step;
  loop     the example's loop: each step gathers its batch on the GPU from the images there (X[batch]);
  host     each step gathers its batch with NumPy and copies it to the GPU instead;
  uploads  the host loop's own work alone: the gathers and the copies, no step.
Each figure is wall time over the steps, ended by reading a result back (which waits for the GPU).

usage: python3 scripts/mnist_resnet_steps.py --data DIR [--kind fashion] [--steps 400] [--rounds 3]
       [--precision fp32|tf32]
"""
import argparse
import importlib.util
import os
import time

import numpy as np

import textnet


def example():
    """examples/mnist_resnet.py as a module."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "mnist_resnet.py")
    spec = importlib.util.spec_from_file_location("mnist_resnet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--kind", default="fashion", choices=["digits", "fashion"])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    args = parser.parse_args()

    (X, y), _ = textnet.datasets.mnist(args.kind, args.data)
    X = ((X - X.mean()) / X.std()).reshape(-1, 1, 28, 28)
    textnet.manual_seed(1)
    textnet.set_precision(args.precision)
    resnet = example()
    model = resnet.ResNet(16).to("cuda")
    train_step = resnet.compiled_step(model, textnet.optim.Adam(model.parameters(), lr=2e-3))

    order = np.random.default_rng(1).permutation(len(X))
    batches = [order[i * args.batch_size:(i + 1) * args.batch_size] for i in range(len(X) // args.batch_size)]
    X_train, y_train = textnet.tensor(X, device="cuda"), textnet.tensor(y, device="cuda")
    order_on_gpu = textnet.tensor(order, device="cuda")

    def gather(i):
        j = i % len(batches)
        batch = order_on_gpu[j * args.batch_size:(j + 1) * args.batch_size]
        return X_train[batch], y_train[batch]

    def upload(i):
        batch = batches[i % len(batches)]
        return textnet.tensor(X[batch], device="cuda"), textnet.tensor(y[batch], device="cuda")

    fixed = upload(0)
    ways = {
        "replay": lambda i: train_step(*fixed),
        "loop": lambda i: train_step(*gather(i)),
        "host": lambda i: train_step(*upload(i)),
        "uploads": lambda i: upload(i)[0],
    }
    for way in ways.values():  # warm-up: the capture, the allocator's pools
        for i in range(20):
            last = way(i)
        last.numpy()
    for r in range(args.rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            for i in range(args.steps):
                last = way(i)
            last.numpy()
            us = (time.perf_counter() - started) / args.steps * 1e6
            print(f"round {r + 1} {name:8s} {us:8.1f} µs a step  ({args.batch_size / us * 1e6:,.0f} images/s)")


if __name__ == "__main__":
    main()
