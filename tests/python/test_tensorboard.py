"""TensorBoard event files read back with tbparse (TensorBoard's own reader underneath): a `textnet`
command's `--tensorboard DIR` and `Sequential.fit(tensorboard_dir=...)` hold each epoch's figures at its
step with the values of the run's report or history, and the run's settings as HParams; a
`SummaryWriter` of one's own writes what PyTorch's would."""

import json

import numpy as np
import pytest

tbparse = pytest.importorskip("tbparse")

import textnet  # noqa: E402
from textnet.tensorboard import SummaryWriter  # noqa: E402


def scalars(log_dir):
    """{tag: {step: value}} of the scalars under log_dir."""
    frame = tbparse.SummaryReader(str(log_dir), pivot=False).scalars
    out = {}
    for tag, step, value in zip(frame["tag"], frame["step"], frame["value"]):
        assert step not in out.setdefault(tag, {}), f"{tag} twice at step {step}"
        out[tag][int(step)] = float(value)
    return out


def hparams(log_dir):
    frame = tbparse.SummaryReader(str(log_dir), pivot=False).hparams
    return dict(zip(frame["tag"], frame["value"]))


def test_a_cli_run_writes_its_report_rows_and_config(cli, tmp_path):
    board = tmp_path / "runs" / "fit"
    done = cli("fit", "--layers", "Linear(16), ReLU, Linear(10)", "--dataset", "fashion", "--train-limit", "600",
               "--epochs", "3", "--val-split", "0.2", "--device", "cpu", "--lr-schedule", "cosine",
               "--out", tmp_path / "m.safetensors", "--json", "--quiet", "--tensorboard", board)
    report = json.loads(done.stdout)
    read = scalars(board)
    keys = {"train_loss": "loss/train", "val_loss": "loss/val", "val_accuracy": "accuracy/val",
            "test_loss": "loss/test", "test_accuracy": "accuracy/test", "lr": "lr", "samples_per_s": "samples_per_s"}
    for row in report["epochs"]:
        for key, tag in keys.items():
            assert read[tag][row["epoch"]] == pytest.approx(row[key], rel=1e-6), (tag, row["epoch"])
    assert sorted(read["loss/train"]) == [1, 2, 3]
    # The cosine schedule: each epoch's rate lower than the one before.
    rates = [read["lr"][e] for e in (1, 2, 3)]
    assert rates == sorted(rates, reverse=True) and rates[0] < report["config"]["lr"]
    settings = hparams(board)
    for key in ("lr", "epochs", "batch", "seed"):
        assert settings[key] == pytest.approx(report["config"][key]), key
    assert settings["lr_schedule"] == "cosine" and settings["device"] == "cpu"


def test_keras_fit_writes_its_history(small, tmp_path):
    X, y, X_test, y_test = small
    model = textnet.Sequential("Linear(784, 16), ReLU, Linear(16, 10)", device="cpu", lr=0.01)
    board = tmp_path / "keras"
    history = model.fit(X[:1000], y[:1000], epochs=3, batch_size=64, validation_split=0.2, verbose=0,
                        tensorboard_dir=board)
    read = scalars(board)
    for key, tag in [("loss", "loss/train"), ("val_loss", "loss/val"), ("val_accuracy", "accuracy/val")]:
        assert [read[tag][e] for e in (1, 2, 3)] == pytest.approx(history.history[key], rel=1e-6), key
    for epoch, seconds in enumerate(history.history["seconds"], start=1):
        assert read["samples_per_s"][epoch] * seconds == pytest.approx(800, rel=1e-4)
    assert read["lr"] == pytest.approx({1: 0.01, 2: 0.01, 3: 0.01})
    settings = hparams(board)
    assert settings["epochs"] == 3 and settings["batch_size"] == 64 and settings["lr"] == pytest.approx(0.01)
    assert settings["layers"] == model._built("fit").spec


def test_a_bad_tensorboard_dir_raises_before_training(small, tmp_path):
    X, y, _, _ = small
    file = tmp_path / "a-file"
    file.write_text("x")
    model = textnet.Sequential("Linear(784, 10)", device="cpu")
    with pytest.raises(OSError, match="not a directory"):
        model.fit(X[:100], y[:100], epochs=1, verbose=0, tensorboard_dir=file)
    assert file.read_text() == "x"


def test_summary_writer_mirrors_torchs(tmp_path):
    with SummaryWriter(tmp_path / "own") as writer:
        for step in range(5):
            writer.add_scalar("loss/train", 1.0 / (step + 1), step)
        writer.add_scalar("acc", np.float32(0.5), global_step=np.int64(4))
        writer.add_hparams({"lr": 0.1, "optim": "adam", "bias": True}, {"hparam/loss": 0.2}, run_name="hp")
    read = scalars(tmp_path / "own")
    assert read["loss/train"] == pytest.approx({s: 1.0 / (s + 1) for s in range(5)})
    assert read["acc"] == {4: 0.5}
    assert scalars(tmp_path / "own" / "hp")["hparam/loss"] == pytest.approx({0: 0.2})
    assert hparams(tmp_path / "own" / "hp") == {"lr": pytest.approx(0.1), "optim": "adam", "bias": True}
    with pytest.raises(ValueError, match="closed"):
        writer.add_scalar("late", 1.0, 0)
    with pytest.raises(TypeError):
        SummaryWriter(tmp_path / "x").add_scalar("t", "one", 0)
