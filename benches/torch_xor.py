#!/usr/bin/env python3
"""PyTorch twin of `textnet bench xor`: the same network (Linear(2,4) -> Sigmoid -> Linear(4,1), PyTorch's
default initialisation), MSE loss, full-batch SGD at lr 0.5 on the four XOR points, 5000 epochs, fp32,
eager mode. The four points live on the device; the loss of every 500th epoch is kept as a tensor and read
after the timed span. Timed: the 5000 epochs, with CUDA events (wall clock on the CPU), after a warm-up run
of 50 epochs on a throwaway model. Prints one JSON object.

usage: python3 benches/torch_xor.py [--device cuda|cpu] [--epochs 5000] [--lr 0.5] [--seed 1] [--repeats 3]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

X = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
T = [[0.0], [1.0], [1.0], [0.0]]


def run(device, epochs, lr, seed, report_every=500):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 4), nn.Sigmoid(), nn.Linear(4, 1)).to(device)
    x = torch.tensor(X, device=device)
    t = torch.tensor(T, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    losses = []
    for epoch in range(epochs):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), t)
        loss.backward()
        opt.step()
        if epoch % report_every == 0:
            losses.append(loss.detach())
    return model, x, losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--epochs", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    run(a.device, 50, a.lr, a.seed)  # warm-up
    seconds = []
    for _ in range(max(1, a.repeats)):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        wall = time.perf_counter()
        model, x, losses = run(a.device, a.epochs, a.lr, a.seed)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            seconds.append(time.perf_counter() - wall)
    with torch.no_grad():
        predictions = model(x).flatten().tolist()
    s = statistics.median(seconds)
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "device": torch.cuda.get_device_name() if cuda else "cpu",
        "mode": "eager", "epochs": a.epochs, "lr": a.lr, "seconds_median": s, "seconds": seconds,
        "us_per_epoch": s * 1e6 / a.epochs, "losses": [float(l) for l in losses],
        "final_loss": float(losses[-1]), "predictions": predictions,
        "solved": all(abs(p - t[0]) < 0.5 for p, t in zip(predictions, T)),
    }, indent=2))


if __name__ == "__main__":
    main()
