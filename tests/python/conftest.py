"""Shared fixtures: Fashion-MNIST (the Debian package `dataset-fashion-mnist`, which scripts/test.sh
installs), the `textnet` binary the same checkout builds, and a small corpus."""

import os
import pathlib
import subprocess

import numpy as np
import pytest

import textnet

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
def cli():
    """Runs the `textnet` binary of this checkout (TEXTNET_BIN, else target/release/textnet)."""
    binary = os.environ.get("TEXTNET_BIN", str(ROOT / "target" / "release" / "textnet"))
    assert os.path.exists(binary), f"{binary} is missing: build it with cargo build --release"

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
