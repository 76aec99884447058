#!/usr/bin/env python3
"""PyTorch baseline for `textnet bench mnist`: the same classifier (Linear(784,128) -> ReLU -> Linear(128,10),
softmax cross-entropy, Xavier-uniform weights, zero biases), Adam lr 1e-3, batch 64, 10 epochs of
Fashion-MNIST, fp32, eager mode. Both splits sit on the GPU as tensors; each epoch draws a random permutation
on the GPU and slices it into index batches (no DataLoader); the test split is evaluated after every epoch,
as `textnet mnist` does. The timed span is the 10 epochs, evaluations included, after one untimed warm-up
step on a throwaway model (CUDA context, cuBLAS handles). Prints one JSON object.

Reads the four IDX files (raw or .gz) from ./data/fashion-mnist, else /usr/share/datasets/fashion-mnist.

With --model cnn: Conv2d(1,8,3,pad 1) -> ReLU -> MaxPool2d(2) -> Conv2d(8,16,3,pad 1) -> ReLU -> MaxPool2d(2)
-> Flatten -> Linear(784,64) -> ReLU -> Linear(64,10), PyTorch's default initialisation (`textnet bench mnist
--model cnn`; cuDNN's convolution algorithms, TF32 off).

usage: python3 benches/torch_mnist.py [--model mlp|cnn] [--data DIR] [--epochs 10] [--batch 64] [--seed 0]
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
SEARCH = ["./data/fashion-mnist", "/usr/share/datasets/fashion-mnist"]


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims).copy()


def find_files(data_dir):
    for d in [data_dir] if data_dir else SEARCH:
        paths = []
        for name in FILES:
            found = [p for p in (os.path.join(d, name), os.path.join(d, name + ".gz")) if os.path.isfile(p)]
            if not found:
                break
            paths.append(found[0])
        else:
            return d, paths
    raise SystemExit(f"Fashion-MNIST not found in {data_dir or ' or '.join(SEARCH)} (need {', '.join(FILES)}, raw or .gz)")


class Mlp(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.hidden = nn.Linear(784, hidden)
        self.out = nn.Linear(hidden, 10)
        for layer in (self.hidden, self.out):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        return self.out(F.relu(self.hidden(x)))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x.view(-1, 1, 28, 28))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--data", default=None)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data_dir, paths = find_files(args.data)
    dev = torch.device("cuda")
    to_images = lambda a: torch.tensor(a.reshape(len(a), -1), dtype=torch.float32, device=dev) / 255.0
    train_x, test_x = to_images(read_idx(paths[0])), to_images(read_idx(paths[2]))
    train_y = torch.tensor(read_idx(paths[1]), dtype=torch.long, device=dev)
    test_y = torch.tensor(read_idx(paths[3]), dtype=torch.long, device=dev)
    n = len(train_y)

    torch.backends.cudnn.allow_tf32 = False
    make = Cnn if args.model == "cnn" else Mlp
    warm = make().to(dev)
    warm_opt = torch.optim.Adam(warm.parameters(), lr=1e-3)
    F.cross_entropy(warm(train_x[: args.batch]), train_y[: args.batch]).backward()
    warm_opt.step()
    torch.cuda.synchronize()

    torch.manual_seed(args.seed)
    model = make().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    epochs = []
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.perf_counter()
        perm = torch.randperm(n, device=dev, generator=gen)
        loss_sum = torch.zeros((), device=dev)
        for first in range(0, n, args.batch):
            idx = perm[first:first + args.batch]
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * len(idx)
        with torch.no_grad():
            logits = model(test_x)
            test_loss = F.cross_entropy(logits, test_y, reduction="sum").item() / len(test_y)
            accuracy = (logits.argmax(1) == test_y).float().mean().item()
        epochs.append({
            "epoch": epoch, "wall_s": time.perf_counter() - epoch_start, "train_loss": loss_sum.item() / n,
            "test_loss": test_loss, "test_accuracy": accuracy,
        })
    total = time.perf_counter() - start
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": "eager", "model": args.model,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "data_dir": data_dir,
        "batch": args.batch, "epochs": args.epochs, "optimizer": "adam lr 0.001",
        "total_s": total, "test_accuracy": epochs[-1]["test_accuracy"], "per_epoch": epochs,
    }, indent=2))


if __name__ == "__main__":
    main()
