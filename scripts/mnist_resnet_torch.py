#!/usr/bin/env python3
"""examples/mnist_resnet.py's model and loop in plain PyTorch eager (no torch.compile, no CUDA graph), the
twin its speed is measured against: the same network (a 3×3 stem, two residual blocks, a 2×2 max-pool, a
linear head), Adam, batch 128, the images normalised the same way, kept on the device and each batch
gathered there, as the example's. Prints one line a epoch, as the example.

usage: python3 scripts/mnist_resnet_torch.py --data DIR [--epochs 3] [--width 16] [--device cuda]
"""
import argparse, gzip, os, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def idx(path):
    """An IDX file (raw or .gz) as a NumPy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, name):
    for suffix in ("", ".gz"):
        path = os.path.join(folder, name + suffix)
        if os.path.exists(path):
            return idx(path)
    raise SystemExit(f"{name} not found in {folder}")


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class ResNet(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.blocks = nn.Sequential(ResidualBlock(width), ResidualBlock(width))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(width * 14 * 14, classes)

    def forward(self, x):
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(self.pool(x).flatten(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    X = load(args.data, "train-images-idx3-ubyte").astype(np.float32).reshape(-1, 784) / 255
    y = load(args.data, "train-labels-idx1-ubyte").astype(np.int64)
    X_test = load(args.data, "t10k-images-idx3-ubyte").astype(np.float32).reshape(-1, 784) / 255
    y_test = load(args.data, "t10k-labels-idx1-ubyte").astype(np.int64)
    mean, std = X.mean(), X.std()
    X = ((X - mean) / std).reshape(-1, 1, 28, 28)
    X_test = ((X_test - mean) / std).reshape(-1, 1, 28, 28)

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)
    model = ResNet(args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps = len(X) // args.batch_size
    X_train, y_train = torch.from_numpy(X).to(device), torch.from_numpy(y).to(device)
    for epoch in range(1, args.epochs + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.time()
        order = torch.from_numpy(rng.permutation(len(X))).to(device)
        for i in range(steps):
            batch = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss = F.cross_entropy(model(X_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        last = loss.item()
        seconds = time.time() - started
        model.eval()
        right = 0
        with torch.no_grad():
            for s in range(0, len(X_test), 1000):
                xb = torch.from_numpy(X_test[s:s + 1000]).to(device)
                right += int((model(xb).argmax(1).cpu().numpy() == y_test[s:s + 1000]).sum())
        model.train()
        print(f"epoch {epoch}: loss {last:.4f}, test accuracy {100 * right / len(X_test):.2f} %, "
              f"{steps * args.batch_size / seconds:,.0f} images/s")


if __name__ == "__main__":
    main()
