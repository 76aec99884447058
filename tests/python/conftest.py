"""Shared fixtures: Fashion-MNIST (the Debian package `dataset-fashion-mnist`, which scripts/test.sh
installs), the `textnet` binary the same checkout builds, a small corpus, random samples and crafted
model files."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import textnet

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def keeps_the_precision():
    """Each test starts at the precision the one before found: `set_precision` is process-wide, and an
    example run in the process (nanoGPT's, bf16 by default) would otherwise leave it set for the rest."""
    precision = textnet.get_precision()
    yield
    textnet.set_precision(precision)


@pytest.fixture(scope="package")
def fashion():
    (X, y), (X_test, y_test) = textnet.datasets.mnist("fashion")
    return X, y, X_test, y_test


@pytest.fixture(scope="package")
def small(fashion):
    """3,000 training and 1,000 test samples: enough to learn, quick on the CPU."""
    X, y, X_test, y_test = fashion
    return X[:3000], y[:3000], X_test[:1000], y_test[:1000]


@pytest.fixture(scope="package")
def binary():
    """The `textnet` binary of this checkout (TEXTNET_BIN, else target/release/textnet)."""
    path = os.environ.get("TEXTNET_BIN", str(ROOT / "target" / "release" / "textnet"))
    assert os.path.exists(path), f"{path} is missing: build it with cargo build --release"
    return path


@pytest.fixture(scope="package")
def cli(binary):
    """Runs the `textnet` binary of this checkout."""

    def run(*args, check=True):
        done = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
        if check:
            assert done.returncode == 0, done.stderr
        return done

    return run


@pytest.fixture(scope="package")
def corpus(tmp_path_factory):
    """The first 60 kB of the repository's Shakespeare."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_bytes((ROOT / "corpus" / "shakespeare.txt").read_bytes()[:60_000])
    return path


def pgm(path, image):
    """Writes a 28×28 float image in [0, 1] as a binary PGM file."""
    pixels = np.round(image.reshape(28, 28) * 255).astype(np.uint8)
    path.write_bytes(b"P5\n28 28\n255\n" + pixels.tobytes())
    return path


def with_metadata(source, target, **entries):
    """Writes the safetensors file `source` to `target` with these metadata entries set (the tensors as
    they were): a crafted model file."""
    data = pathlib.Path(source).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"].update(entries)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pathlib.Path(target).write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])
    return target


def random_samples(n=300, features=784, classes=10, seed=0):
    """`n` random float32 samples with labels 0 to classes − 1: data for tests that need no dataset."""
    rng = np.random.default_rng(seed)
    return rng.random((n, features), dtype=np.float32), np.arange(n) % classes
