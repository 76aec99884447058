"""The Python examples at a small size on the CPU: micrograd's demo, nanoGPT's model and loop, and the
residual CNN on a few Fashion-MNIST images written as IDX files."""

import gzip
import importlib.util
import math

import numpy as np

import textnet
from conftest import ROOT


def example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_micrograd_moons_learns_the_two_moons(capsys):
    history = example("micrograd_moons").main(["--steps", "30"])
    losses = [loss for loss, _ in history]
    assert len(history) == 30 and losses[-1] < 0.5 * losses[0]
    assert history[-1][1] > 0.8
    assert "step 29 loss" in capsys.readouterr().out


def test_nanogpt_trains_from_the_uniform_loss_down(tmp_path, capsys):
    text = (ROOT / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    data = tmp_path / "small.txt"
    data.write_text(text, encoding="utf-8")
    vocab = len(set(text))
    flags = "--n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 --max-iters 30 --eval-interval 30 " \
            "--eval-iters 5 --warmup-iters 5 --lr-decay-iters 30 --dropout 0.1 --sample-tokens 20"
    before = textnet.get_precision()
    try:
        history = example("nanogpt").main(["--data", str(data)] + flags.split())
    finally:
        textnet.set_precision(before)  # the example sets it (bf16 by default) for the process
    first, last = history["val"][0], history["val"][-1]
    assert abs(first - math.log(vocab)) < 0.2, (first, math.log(vocab))
    assert last < first - 0.2
    out = capsys.readouterr().out
    assert "step 30: train loss" in out and "tokens/s" in out


def write_idx(path, array):
    """`array` (uint8) as a gzipped IDX file: the magic number (type 8, the axis count), each axis's size,
    the bytes."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def test_mnist_resnet_reads_idx_files_and_its_loss_falls(tmp_path, fashion, capsys):
    X, y, X_test, y_test = fashion
    for split, images, labels, count in [("train", X, y, 480), ("t10k", X_test, y_test, 200)]:
        pixels = np.round(images[:count] * 255).astype(np.uint8).reshape(count, 28, 28)
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", pixels)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels[:count].astype(np.uint8))
    flags = "--kind fashion --width 8 --epochs 2 --batch-size 32 --log-interval 1"
    history = example("mnist_resnet").main(["--data", str(tmp_path)] + flags.split())
    losses = history["loss"]
    assert len(losses) == 2 * (480 // 32)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    assert history["test_accuracy"][-1] > 0.5
    out = capsys.readouterr().out
    assert "480 training images on cpu" in out and "epoch 2: loss" in out
