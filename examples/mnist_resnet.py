"""A small residual CNN on MNIST digits (or Fashion-MNIST) with textnet, written as a PyTorch user writes
one: an ``nn.Module`` with its ``forward``, and its own training loop whose step (forward, loss,
backward, Adam) is ``textnet.compile``d: captured as a CUDA graph on the GPU, the function itself on the
CPU.

The network: a 3×3 convolution 1 → width channels, then two residual blocks (3×3 convolution, ReLU,
3×3 convolution, plus the block's input, ReLU), a 2×2 max-pool and a linear head width·14·14 → 10.

The images are the four IDX files (raw or .gz) in ``--data``, or found where ``textnet mnist`` looks;
``--train-samples`` and ``--test-samples`` take the first ones of each split, for a quick run. The training
images and labels go to the device once; each step's batch is gathered there (``X[batch]`` with a tensor of
ids), as a PyTorch loop that keeps its data on the GPU does.

usage: python examples/mnist_resnet.py [--data DIR] [--kind digits|fashion] [--device cpu|cuda]
       [--precision fp32|tf32] [--width 16 --epochs 3 --batch-size 128 --lr 2e-3]
       [--train-samples N --test-samples N]

``--precision tf32`` multiplies the GPU's convolutions in one TF32 product, as PyTorch's convolutions do by
default (``torch.backends.cudnn.allow_tf32``); ``fp32``, the default, in 3xTF32, fp32's accuracy.
"""

import argparse
import time

import numpy as np

import textnet
import textnet.nn.functional as F
from textnet import nn


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


def compiled_step(model, optimizer):
    """The training step (forward, cross-entropy, backward, the optimizer's step), compiled: captured as a
    CUDA graph at its first call on the GPU."""
    @textnet.compile
    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return train_step


def accuracy(model, images, labels, device, batch_size):
    """The fraction of ``images`` whose largest logit is their label, dropout off, no graph."""
    model.eval()
    right = 0
    with textnet.no_grad():
        for start in range(0, len(images), batch_size):
            x = textnet.tensor(images[start:start + batch_size], device=device)
            right += int((model(x).numpy().argmax(1) == labels[start:start + batch_size]).sum())
    model.train()
    return right / len(images)


def main(argv=None):
    parser = argparse.ArgumentParser(description="a small residual CNN on MNIST with textnet")
    parser.add_argument("--data", default=None, help="folder of the four IDX files (raw or .gz)")
    parser.add_argument("--kind", default="digits", choices=["digits", "fashion"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32"],
                        help="the GPU's convolutions: fp32 (3xTF32) or tf32 (one TF32 product, PyTorch's default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train-samples", type=int, default=None)
    parser.add_argument("--test-samples", type=int, default=None)
    parser.add_argument("--log-interval", type=int, default=100, help="steps between two losses read back")
    args = parser.parse_args(argv)

    (X, y), (X_test, y_test) = textnet.datasets.mnist(args.kind, args.data)
    X, y = X[:args.train_samples], y[:args.train_samples]
    X_test, y_test = X_test[:args.test_samples], y_test[:args.test_samples]
    mean, std = X.mean(), X.std()
    X = ((X - mean) / std).reshape(-1, 1, 28, 28)
    X_test = ((X_test - mean) / std).reshape(-1, 1, 28, 28)
    if len(X) < args.batch_size:
        parser.error(f"--batch-size {args.batch_size} is more than the {len(X)} training images")

    textnet.manual_seed(args.seed)
    textnet.set_precision(args.precision)
    rng = np.random.default_rng(args.seed)
    device = args.device
    model = ResNet(args.width).to(device)
    optimizer = textnet.optim.Adam(model.parameters(), lr=args.lr)
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters, {len(X):,} training images on {device}")

    train_step = compiled_step(model, optimizer)
    X_train, y_train = textnet.tensor(X, device=device), textnet.tensor(y, device=device)
    history = {"step": [], "loss": [], "test_accuracy": []}
    steps_per_epoch = len(X) // args.batch_size  # whole batches only: the captured step keeps its shape
    step = 0
    for epoch in range(1, args.epochs + 1):
        started = time.time()
        order = textnet.tensor(rng.permutation(len(X)), device=device)
        for i in range(steps_per_epoch):
            batch = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss = train_step(X_train[batch], y_train[batch])
            if step % args.log_interval == 0 or i == steps_per_epoch - 1:
                history["step"].append(step)
                history["loss"].append(loss.item())  # waits for the GPU
            step += 1
        seconds = time.time() - started
        history["test_accuracy"].append(accuracy(model, X_test, y_test, device, 1000))
        print(f"epoch {epoch}: loss {history['loss'][-1]:.4f}, test accuracy "
              f"{100 * history['test_accuracy'][-1]:.2f} %, {steps_per_epoch * args.batch_size / seconds:,.0f} "
              "images/s")
    if train_step.fusions():
        print("the step is captured; its fusions:", ", ".join(f"{n} ×{c}" for n, c in train_step.fusions()))
    return history


if __name__ == "__main__":
    main()
