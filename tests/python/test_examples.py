"""The Python examples at a small size on the CPU: micrograd's demo and nanoGPT's model and loop."""

import importlib.util
import math

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
    history = example("nanogpt").main(["--data", str(data)] + flags.split())
    first, last = history["val"][0], history["val"][-1]
    assert abs(first - math.log(vocab)) < 0.2, (first, math.log(vocab))
    assert last < first - 0.2
    out = capsys.readouterr().out
    assert "step 30: train loss" in out and "tokens/s" in out
