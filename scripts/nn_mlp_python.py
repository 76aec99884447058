#!/usr/bin/env python3
"""The Python face of `textnet bench nn`'s MLP row: the 784-128-10 MLP (Linear, ReLU, Linear; cross-entropy,
Adam lr 1e-3, batch 64, one resident batch on the GPU, as bench nn's) written as a textnet ``nn.Module``
and trained by a ``textnet.compile``d step, called once a step from Python. Prints the wall time a step
takes over `--steps` steps (one Fashion-MNIST epoch at batch 64 by default) after the GPU finishes, the
median of `--repeats` rounds after a warm-up round: Python's call, the inputs' refill and the graph's
replay, the figure to set beside `textnet bench fit`'s ``us_per_step`` in the same run. Prints one JSON
object.

    PYTHONPATH=<the package> python3 scripts/nn_mlp_python.py [--steps 938] [--repeats 7]
"""
import argparse
import json
import time

import numpy as np

import textnet
import textnet.nn.functional as F
from textnet import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=938)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    textnet.manual_seed(1)
    rng = np.random.default_rng(1)
    model = Mlp().to("cuda")
    optimizer = textnet.optim.Adam(model.parameters(), lr=1e-3)
    x = textnet.tensor(rng.standard_normal((64, 784)).astype(np.float32), device="cuda")
    y = textnet.tensor(rng.integers(0, 10, 64), device="cuda")

    @textnet.compile
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def round_():
        for _ in range(args.steps):
            loss = step(x, y)
        return loss.item()  # waits for the GPU

    round_()
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        round_()
        times.append((time.perf_counter() - started) * 1e6 / args.steps)
    print(json.dumps({"workload": "MLP 784-128-10 step, textnet.compile from Python", "steps": args.steps,
                      "wall_us_per_step": sorted(times)[len(times) // 2], "fusions": step.fusions()}))


if __name__ == "__main__":
    main()
