#!/usr/bin/env python3
"""Trains micrograd's scalar engine from the start `examples/micrograd_moons.rs` wrote (the same points,
labels and initial weights) with the same loss and schedule, and compares its loss curve with the example's
f64 and f32 curves, step by step. micrograd is imported from the folder given (a checkout of
karpathy/micrograd); nothing of it is copied here.

usage: python3 scripts/micrograd_compare.py MICROGRAD_FOLDER [target/micrograd_moons.json] [--tolerance 1e-5]
Exits 1 when the f64 curve differs from micrograd's by more than the tolerance at any step.
"""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("micrograd", help="folder holding the micrograd package")
    parser.add_argument("start", nargs="?", default="target/micrograd_moons.json")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    sys.path.insert(0, args.micrograd)
    from micrograd.engine import Value
    from micrograd.nn import MLP

    with open(args.start) as f:
        start = json.load(f)
    widths = [len(start["layers"][0]["weight"][0])] + [len(layer["bias"]) for layer in start["layers"]]
    model = MLP(widths[0], widths[1:])
    for layer, given in zip(model.layers, start["layers"]):
        for neuron, row, bias in zip(layer.neurons, given["weight"], given["bias"]):
            for weight, value in zip(neuron.w, row):
                weight.data = value
            neuron.b.data = bias

    steps, l2 = start["steps"], start["l2"]
    curve = []
    for k in range(steps):
        scores = [model([Value(x) for x in point]) for point in start["points"]]
        margins = [(1 - label * score).relu() for label, score in zip(start["labels"], scores)]
        loss = sum(margins) * (1.0 / len(margins)) + l2 * sum(p * p for p in model.parameters())
        model.zero_grad()
        loss.backward()
        rate = 1.0 - 0.9 * k / steps
        for p in model.parameters():
            p.data -= rate * p.grad
        curve.append(loss.data)

    worst = {}
    for name in ("loss_f64", "loss_f32"):
        gaps = [abs(a - b) for a, b in zip(start[name], curve)]
        step = max(range(len(gaps)), key=gaps.__getitem__)
        worst[name] = max(gaps)
        print(f"{name}: largest |textnet − micrograd| {max(gaps):.3e} at step {step} "
              f"(textnet {start[name][step]:.12f}, micrograd {curve[step]:.12f})")
    for k in (0, 1, steps // 2, steps - 1):
        print(f"step {k}: micrograd {curve[k]:.12f}, textnet f64 {start['loss_f64'][k]:.12f}, "
              f"f32 {start['loss_f32'][k]:.12f}")
    if worst["loss_f64"] > args.tolerance:
        print(f"the f64 curve is off by more than {args.tolerance}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
