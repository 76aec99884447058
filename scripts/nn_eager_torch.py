"""PyTorch eager's side of `textnet bench nn`: the same three workloads on the same GPU, timed the same
way (host time to enqueue a round of ops, and wall time once the GPU is done, per op; median of the
repeats after one warm-up round). Prints one JSON object.

    python3 scripts/nn_eager_torch.py [--ops 2000] [--repeats 7]
"""
import argparse
import json
import time

import torch


def timed(repeats, ops, round_fn):
    round_fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        round_fn()
        host.append((time.perf_counter() - started) * 1e6 / ops)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - started) * 1e6 / ops)
    return sorted(host)[len(host) // 2], sorted(wall)[len(wall) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(1)
    dev = torch.device("cuda")
    small = torch.rand(64, 64, device=dev) * 2 - 1
    rows = []

    def scalar_round():
        with torch.no_grad():
            x = small
            for _ in range(args.ops):
                x = x * 0.999

    rows.append(("mul_scalar 64×64, no grad", args.ops, *timed(args.repeats, args.ops, scalar_round)))

    def add_round():
        x = small
        for _ in range(args.ops):
            x = x + small

    rows.append(("add 64×64 (inputs need no grad)", args.ops, *timed(args.repeats, args.ops, add_round)))

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(64, 784, device=dev) * 2 - 1
    targets = torch.arange(64, device=dev) % 10
    steps = max(args.ops // 20, 1)

    def step_round():
        for _ in range(steps):
            sgd.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), targets)
            loss.backward()
            sgd.step()

    rows.append(("MLP 784-128-10 step, batch 64 (per step)", steps, *timed(args.repeats, steps, step_round)))
    out = {"bench": "nn (PyTorch eager)", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "rows": [{"workload": w, "ops": n, "host_us": h, "wall_us": t} for w, n, h, t in rows]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
