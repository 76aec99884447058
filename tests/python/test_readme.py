"""The README's Python quick starts run as written (on the CPU, at the size they show) and learn: the Keras
one through `Sequential.fit`, the PyTorch one through its own loop of `textnet.compile`d steps."""

import re

import numpy as np

from conftest import ROOT


def readme_python_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run_block(index, folder, monkeypatch):
    """The block's names after running it, in `folder` (the Keras one saves a model file there)."""
    monkeypatch.chdir(folder)
    names = {"__name__": "readme"}
    exec(compile(readme_python_blocks()[index], f"README.md, Python block {index + 1}", "exec"), names)
    return names


def test_the_readme_has_two_python_quick_starts():
    assert len(readme_python_blocks()) == 2


def test_the_keras_quick_start_learns(tmp_path, monkeypatch):
    names = run_block(0, tmp_path, monkeypatch)
    assert names["history"].history["accuracy"][-1] > 0.7
    assert names["model"].evaluate(names["X_test"], names["y_test"])[1] > 0.7
    assert (tmp_path / "fashion.safetensors").exists()


def test_the_pytorch_quick_start_learns(tmp_path, monkeypatch, capsys):
    names = run_block(1, tmp_path, monkeypatch)
    accuracy = np.mean(names["predicted"] == names["y_test"])
    assert accuracy > 0.7
    assert f"test accuracy {accuracy:.3f}" in capsys.readouterr().out
