#!/usr/bin/env python3
"""PyTorch twin of `textnet bench sales`: the same table, features, model and hyper-parameters.

Features as textnet builds them from the default sales.tsv schema: quantity and unit price (columns 5
and 6), category (column 7) one-hot in order of first appearance among the training rows, day of year of
the date (column 3); target total price (column 9). The first 80 % of the rows train, the rest test;
features and target standardised with the training rows' mean and population std. Model
Linear(n,32) -> ReLU -> Linear(32,1) (PyTorch's default initialisation), MSE, Adam lr 1e-3, shuffled
mini-batches of 64 (torch.randperm each epoch), fp32 (TF32 off), eager mode, data on the device.

Timed with CUDA events: --epochs epochs (each a training pass and the test MAE), after a warm-up of 200
steps. Eager PyTorch takes minutes for all 50 epochs, so the default times 2 and scales to 50
("seconds_50_epochs_scaled"). Prints one JSON object.

usage: python3 benches/torch_sales.py [--table data/sales.tsv] [--epochs 2] [--seed 1] [--device cuda|cpu]
"""
import argparse
import csv
import datetime
import json
import time

import torch
import torch.nn as nn


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    n_train = round(len(rows) * 0.8)
    vocabulary = {}
    for r in rows[:n_train]:
        vocabulary.setdefault(r[6], len(vocabulary))

    def features(r):
        one_hot = [0.0] * len(vocabulary)
        if r[6] in vocabulary:
            one_hot[vocabulary[r[6]]] = 1.0
        day = datetime.date.fromisoformat(r[2]).timetuple().tm_yday
        return [float(r[4]), float(r[5])] + one_hot + [float(day)]

    x = torch.tensor([features(r) for r in rows], dtype=torch.float64)
    y = torch.tensor([float(r[8]) for r in rows], dtype=torch.float64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="data/sales.tsv")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = a.device.startswith("cuda")
    loaded = time.perf_counter()
    x_train, y_train, x_test, y_test = load(a.table)
    load_s = time.perf_counter() - loaded
    mean, std = x_train.mean(0), x_train.std(0, unbiased=False)
    std[std == 0] = 1.0
    t_mean, t_std = y_train.mean(), y_train.std(unbiased=False)
    baseline_mae = float((y_test - t_mean).abs().mean())
    dev = torch.device(a.device)
    xs = ((x_train - mean) / std).float().to(dev)
    ys = ((y_train - t_mean) / t_std).float().to(dev).unsqueeze(1)
    xt = ((x_test - mean) / std).float().to(dev)
    yt = ((y_test - t_mean) / t_std).float().to(dev).unsqueeze(1)
    n, rows, batch = xs.shape[1], xs.shape[0], 64

    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(n, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    generator = torch.Generator(device=dev).manual_seed(a.seed)

    def step(idx):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        return loss.detach() * idx.numel()

    warm = nn.Sequential(nn.Linear(n, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev)
    warm_opt = torch.optim.Adam(warm.parameters(), lr=1e-3)
    for k in range(200):
        idx = torch.arange(k * batch, (k + 1) * batch, device=dev) % rows
        warm_opt.zero_grad(set_to_none=True)
        loss_fn(warm(xs[idx]), ys[idx]).backward()
        warm_opt.step()
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    wall = time.perf_counter()
    history = []
    for _ in range(a.epochs):
        order = torch.randperm(rows, device=dev, generator=generator)
        total = torch.zeros((), device=dev)
        for b in range(0, rows, batch):
            total += step(order[b:b + batch])
        with torch.no_grad():
            mae = (model(xt) - yt).abs().mean() * float(t_std)
        history.append((total / rows, mae))
    if cuda:
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        seconds = time.perf_counter() - wall
    steps = a.epochs * ((rows + batch - 1) // batch)
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "mode": "eager",
        "table": a.table, "train_rows": rows, "test_rows": xt.shape[0], "features": n,
        "epochs_timed": a.epochs, "steps": steps, "load_s": load_s,
        "seconds": seconds,
        "us_per_step": seconds * 1e6 / steps,
        "seconds_50_epochs_scaled": seconds / a.epochs * 50,
        "baseline_mae": baseline_mae,
        "history": [{"train_mse": float(l), "test_mae": float(m)} for l, m in history],
        "test_mae": float(history[-1][1]) if history else None,
    }, indent=2))


if __name__ == "__main__":
    main()
