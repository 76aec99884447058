"""PyTorch eager's side of `textnet bench nn`: the same eager ops and the same training steps on the same
GPU, timed the same way, under the same workload names. Prints one JSON object.

Eager ops: `--ops` ops enqueued back to back. Training steps (cross-entropy, Adam lr 1e-3, batch 64, one
resident batch of MNIST-sized inputs, as bench nn's): the 784-128-10 MLP and the residual MLP
Linear(784, 256), two blocks x + Linear(256, 256)(ReLU(Linear(256, 256)(x))), Linear(256, 10); a round is
`--steps` steps, by default one Fashion-MNIST epoch at batch 64 (938). For each workload: the host time to
enqueue a round, the wall time once the GPU is done (torch.cuda.synchronize) and the device time between
CUDA events around the round, per op or step; the median of `--repeats` rounds after one warm-up round.
Adam is torch's default for CUDA tensors (the multi-tensor `foreach` form), the eager baseline.

    python3 scripts/nn_eager_torch.py [--ops 2000] [--steps 938] [--repeats 7]
"""
import argparse
import json
import time

import torch

BATCH = 64


def timed(workload, unit, repeats, count, round_fn):
    round_fn()
    torch.cuda.synchronize()
    host, wall, device = [], [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        start.record()
        round_fn()
        end.record()
        host.append((time.perf_counter() - started) * 1e6 / count)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - started) * 1e6 / count)
        device.append(start.elapsed_time(end) * 1e3 / count)
    median = lambda v: sorted(v)[len(v) // 2]
    return {"workload": workload, "unit": unit, "per_round": count, "host_us": median(host),
            "wall_us": median(wall), "device_us": median(device)}


class Residual(torch.nn.Module):
    """x + f(x)."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return x + self.f(x)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def residual_mlp():
    block = lambda: Residual(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)))
    return torch.nn.Sequential(torch.nn.Linear(784, 256), block(), block(), torch.nn.Linear(256, 10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=-(-60000 // BATCH))
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

    rows.append(timed("mul_scalar 64×64, no grad", "op", args.repeats, args.ops, scalar_round))

    def add_round():
        x = small
        for _ in range(args.ops):
            x = x + small

    rows.append(timed("add 64×64 (inputs need no grad)", "op", args.repeats, args.ops, add_round))

    x = torch.rand(BATCH, 784, device=dev) * 2 - 1
    targets = torch.arange(BATCH, device=dev) % 10
    for name, model in [("MLP 784-128-10 step", mlp()), ("residual MLP 784-256-2×res-10 step", residual_mlp())]:
        model = model.to(dev)
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step_round():
            for _ in range(args.steps):
                adam.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), targets)
                loss.backward()
                adam.step()

        rows.append(timed(name, "step", args.repeats, args.steps, step_round))
    out = {"bench": "nn (PyTorch eager)", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "steps": {"batch": BATCH, "optimizer": "adam lr 0.001", "loss": "cross_entropy"}, "rows": rows}
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
