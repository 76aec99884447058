"""Every bad input is an exception carrying one line: ValueError, FileNotFoundError, RuntimeError, MemoryError."""

import os
import subprocess
import sys

import numpy as np
import pytest

import textnet
from conftest import random_samples, with_metadata

SPEC = "Linear(784, 16), ReLU, Linear(16, 10)"


@pytest.fixture
def model():
    return textnet.Sequential(SPEC, device="cpu")


def one_line(error):
    text = str(error.value)
    assert text and "\n" not in text, text
    return text


def test_wrong_shapes(model, small):
    X, y, _, _ = small
    with pytest.raises(ValueError) as e:
        model.fit(X[:, :700], y, epochs=1, verbose=0)
    assert "shape" in one_line(e) and "784" in one_line(e)
    with pytest.raises(ValueError) as e:
        model.fit(X[:100], y[:99], epochs=1, verbose=0)
    assert "100 samples" in one_line(e)
    with pytest.raises(ValueError) as e:
        model.fit(X[0], y[:1], epochs=1, verbose=0)
    assert "one row per sample" in one_line(e)
    with pytest.raises(ValueError) as e:
        model.predict(np.zeros((0, 784), np.float32))
    assert "no samples" in one_line(e)


def test_wrong_dtypes(model, small):
    X, y, _, _ = small
    with pytest.raises(ValueError) as e:
        model.fit(np.full((4, 784), "a"), y[:4], epochs=1, verbose=0)
    assert "numbers" in one_line(e)
    with pytest.raises(ValueError) as e:
        model.fit(X[:4], np.array(["a", "b", "c", "d"]), epochs=1, verbose=0)
    assert "integer class labels" in one_line(e)
    with pytest.raises(ValueError) as e:
        model.fit(X[:4], np.array([0.5, 1, 2, 3]), epochs=1, verbose=0)
    assert "whole numbers" in one_line(e)


def test_nan_in_the_inputs(model, small):
    X, y, _, _ = small
    bad = X[:10].copy()
    bad[3, 17] = np.nan
    with pytest.raises(ValueError) as e:
        model.fit(bad, y[:10], epochs=1, verbose=0)
    assert "sample 3, feature 17" in one_line(e)
    with pytest.raises(ValueError):
        model.evaluate(bad, y[:10])
    with pytest.raises(ValueError):
        model.fit(X[:10], np.array([0, 1, 2, np.nan, 4, 5, 6, 7, 8, 9]), epochs=1, verbose=0)


def test_labels_out_of_range(model, small):
    X, y, _, _ = small
    labels = y[:10].copy()
    labels[4] = 10
    with pytest.raises(ValueError) as e:
        model.fit(X[:10], labels, epochs=1, verbose=0)
    assert "y[4] is 10" in one_line(e) and "0 to 9" in one_line(e)
    labels[4] = -1
    with pytest.raises(ValueError):
        model.evaluate(X[:10], labels)


def test_bad_settings(small):
    X, y, _, _ = small
    with pytest.raises(ValueError) as e:
        textnet.Sequential("Linear(784, 16), Relu(3)")
    one_line(e)
    with pytest.raises(ValueError):
        textnet.Sequential(SPEC, loss="hinge")
    with pytest.raises(ValueError):
        textnet.Sequential(SPEC, optimizer="lbfgs")
    with pytest.raises(ValueError):
        textnet.Sequential(SPEC, device="tpu")
    with pytest.raises(ValueError):
        textnet.Sequential([])
    model = textnet.Sequential(SPEC, device="cpu", lr=-1.0)
    with pytest.raises(ValueError) as e:
        model.fit(X[:10], y[:10], epochs=1, verbose=0)
    assert "lr must be" in one_line(e)
    model = textnet.Sequential(SPEC, device="cpu")
    for bad in ({"epochs": 0}, {"batch_size": 0}, {"verbose": 3}, {"validation_split": 1.5},
                {"validation_data": (X[:5],)}):
        with pytest.raises(ValueError):
            model.fit(X[:10], y[:10], **{"epochs": 1, "verbose": 0, **bad})
    with pytest.raises(ValueError) as e:
        model.fit(X[:10], y[:10], epochs=1, verbose=0, validation_split=0.1, validation_data=(X[:5], y[:5]))
    assert "not both" in one_line(e)
    with pytest.raises(ValueError) as e:
        textnet.Sequential("Flatten, Linear(10)").predict(X[:2])
    assert "call fit first" in one_line(e)


def test_files(tmp_path, model):
    with pytest.raises(FileNotFoundError) as e:
        textnet.load(tmp_path / "missing.safetensors")
    one_line(e)
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("my notes")
    with pytest.raises(ValueError):
        textnet.load(not_a_model)
    with pytest.raises(FileExistsError):
        model.save(not_a_model)
    assert not_a_model.read_text() == "my notes"
    model.save(not_a_model, overwrite=True)
    assert textnet.load(not_a_model).spec == model.spec
    with pytest.raises(FileNotFoundError):
        textnet.datasets.mnist("fashion", path=tmp_path / "nowhere")
    with pytest.raises(ValueError):
        textnet.datasets.mnist("letters")
    with pytest.raises(FileNotFoundError):
        textnet.TextModel.train(tmp_path / "no-corpus.txt", epochs=1)
    with pytest.raises(ValueError) as e:
        textnet.TextModel.train(not_a_model, no_such_flag=3)
    assert "--no-such-flag" in one_line(e)


def test_no_gpu_is_a_runtime_error(small, tmp_path):
    """With no GPU visible, device="cuda" and selftest() raise RuntimeError (also on a GPU machine)."""
    script = (
        "import textnet, numpy as np\n"
        "m = textnet.Sequential('Linear(4, 2)', device='cuda')\n"
        "for call in (lambda: m.fit(np.zeros((8, 4)), np.zeros(8, int), epochs=1, verbose=0),\n"
        "             lambda: m.predict(np.zeros((2, 4))), lambda: textnet.selftest(quick=True)):\n"
        "    try:\n"
        "        call()\n"
        "    except RuntimeError as e:\n"
        "        print('RuntimeError:', e)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RuntimeError: ")]
    assert len(lines) == 3, done.stdout + done.stderr


def test_a_model_too_large_for_memory_is_a_memory_error_before_it_is_built():
    """PY38, PY63, PY70: the command line's memory estimate, at construction or at the first fit."""
    X, y = random_samples()
    with pytest.raises(MemoryError) as e:
        textnet.Sequential("Linear(784, 1000000000), ReLU, Linear(10)", device="cpu")
    assert "this run needs about" in one_line(e) and "lower the widths or channels in the spec" in one_line(e)
    assert "--" not in one_line(e)
    with pytest.raises(MemoryError):
        textnet.Sequential("Conv2d(1, 1000000, 3), Flatten, Linear(10)", input_shape=(1, 28, 28), device="cpu")
    lazy = textnet.Sequential("Linear(1000000000), ReLU, Linear(10)", device="cpu")
    with pytest.raises(MemoryError):
        lazy.fit(X, y, epochs=1, verbose=0)
    model = textnet.Sequential(SPEC, device="cpu")
    with pytest.raises(MemoryError) as e:
        model.fit(X, y, epochs=1, verbose=0, batch_size=10**12)
    assert "batch_size" in one_line(e)


def test_a_model_file_whose_spec_lies_is_a_value_error_of_one_short_line(tmp_path, model):
    """PY21, PY62: the loader checks the spec's sizes against the tensors and quotes at most ~200
    characters of it."""
    path = tmp_path / "m.st"
    model.save(path)
    huge = with_metadata(path, tmp_path / "huge.st", spec="Linear(784, 1000000000000), ReLU, Linear(10)")
    with pytest.raises(ValueError) as e:
        textnet.load(huge)
    assert "tensor 0.weight is [16, 784] but the spec" in one_line(e)
    long = with_metadata(path, tmp_path / "long.st", spec="ReLU, " * 100_000 + model.spec)
    with pytest.raises(ValueError) as e:
        textnet.load(long)
    assert "tensor 100000.weight is missing" in one_line(e) and len(one_line(e)) < 500
