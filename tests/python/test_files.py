"""Model files shared with the command line, what save never replaces, state_dict and to_torch (against
torch when it is installed, else against a NumPy reference of what torch computes)."""

import json
import os
import signal
import stat
import subprocess
import threading

import numpy as np
import pytest

import textnet
import torch_reference
from conftest import pgm, with_metadata

SPEC = "Linear(784, 32), ReLU, Linear(32, 10)"
CNN_SPEC = "Conv2d(1, 4, 3, padding=1), GELU, MaxPool2d(2), Flatten, Dropout(0.2), Linear(16), Tanh, Linear(10)"
# The two specs as torch's nn.Sequential would run them, its layers named by their index.
SPEC_LAYERS = [("0", ("linear",)), ("1", "relu"), ("2", ("linear",))]
CNN_LAYERS = [("0", ("conv2d", 1, 1)), ("1", "gelu_tanh"), ("2", ("max_pool2d", 2)), ("3", "flatten"), ("4", "dropout"),
              ("5", ("linear",)), ("6", "tanh"), ("7", ("linear",))]


def test_a_python_model_is_used_by_textnet_classify(small, cli, tmp_path):
    X, y, X_test, _ = small
    model = textnet.Sequential(SPEC, device="cpu", class_names=textnet.datasets.class_names("fashion"))
    model.fit(X, y, epochs=2, verbose=0)
    path = tmp_path / "python.safetensors"
    model.save(path)
    images = [pgm(tmp_path / f"{i}.pgm", X_test[i]) for i in range(8)]
    predictions = json.loads(cli("classify", "--model", path, *images, "--json").stdout)["predictions"]
    expected = model.predict(X_test[:8])
    assert [p["class"] for p in predictions] == list(expected.argmax(axis=1))
    assert [p["name"] for p in predictions] == [model.class_names[c] for c in expected.argmax(axis=1)]
    assert np.allclose([p["probability"] for p in predictions], expected.max(axis=1), rtol=1e-5)


def test_a_cli_model_is_used_from_python(cli, fashion, tmp_path):
    _, _, X_test, y_test = fashion
    path = tmp_path / "cli.safetensors"
    done = cli("fit", "--layers", SPEC, "--dataset", "fashion", "--train-limit", 3000, "--epochs", 2,
               "--device", "cpu", "-o", path, "--json")
    report = json.loads(done.stdout)
    model = textnet.load(path)
    assert model.class_names[0] == "T-shirt/top"
    model.compile(metrics=["accuracy"])
    scores = model.evaluate(X_test, y_test, return_dict=True)
    assert scores["accuracy"] == pytest.approx(report["epochs"][-1]["test_accuracy"])
    assert scores["loss"] == pytest.approx(report["epochs"][-1]["test_loss"], rel=1e-6)
    # Saved again from Python, the file is the same model.
    again = tmp_path / "again.safetensors"
    model.save(again)
    assert np.array_equal(textnet.load(again).predict(X_test[:50]), model.predict(X_test[:50]))


def test_state_dict_round_trip(small):
    X, y, X_test, _ = small
    a = textnet.Sequential(SPEC, device="cpu", seed=1)
    a.fit(X[:500], y[:500], epochs=1, verbose=0)
    b = textnet.Sequential(SPEC, device="cpu", seed=2)
    assert not np.array_equal(a.predict(X_test[:20]), b.predict(X_test[:20]))
    state = a.state_dict()
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert state["0.weight"].shape == (32, 784) and state["0.weight"].dtype == np.float32
    b.load_state_dict(state)
    assert np.array_equal(a.predict(X_test[:20]), b.predict(X_test[:20]))
    with pytest.raises(ValueError):
        b.load_state_dict({"0.weight": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError):
        b.load_state_dict({"9.weight": np.zeros((3, 3), np.float32)})


def test_to_torch_reproduces_the_predictions(small):
    torch = pytest.importorskip("torch")
    X, y, X_test, _ = small
    for spec, shape in (
        (SPEC, (-1, 784)),
        (CNN_SPEC, (-1, 1, 28, 28)),
    ):
        model = textnet.Sequential(spec, device="cpu")
        model.fit(X[:300].reshape(shape), y[:300], epochs=1, verbose=0)
        torch_model = model.to_torch()
        assert isinstance(torch_model, torch.nn.Sequential)
        with torch.no_grad():
            logits = torch_model(torch.from_numpy(X_test[:64].reshape(shape)))
        expected = model.predict(X_test[:64].reshape(shape))
        assert np.abs(logits.softmax(dim=1).numpy() - expected).max() < 1e-5



def test_the_state_dict_computes_the_predictions_as_torch_would(small):
    """The parameters under nn.Sequential's names, run by the NumPy reference of torch's layers (dropout
    off, as in evaluation), give the model's predictions: what to_torch's model computes, without torch."""
    X, y, X_test, _ = small
    for spec, shape, layers in ((SPEC, (-1, 784), SPEC_LAYERS), (CNN_SPEC, (-1, 1, 28, 28), CNN_LAYERS)):
        model = textnet.Sequential(spec, device="cpu")
        model.fit(X[:300].reshape(shape), y[:300], epochs=1, verbose=0)
        logits = torch_reference.forward(layers, model.state_dict(), X_test[:64].reshape(shape))
        expected = model.predict(X_test[:64].reshape(shape))
        assert np.abs(torch_reference.softmax(logits) - expected).max() < 1e-5

def test_save_never_replaces_a_model_of_another_kind(tmp_path):
    """PY16: as the command line's --out, even with overwrite=True."""
    model = textnet.Sequential(SPEC, device="cpu")
    path = tmp_path / "m.st"
    model.save(path)
    for tag, what in (("textnet-text", "a next-token text model"), ("textnet-sales", "a sales (table) regressor")):
        other = with_metadata(path, tmp_path / f"{tag}.st", format=tag)
        before = other.read_bytes()
        for overwrite in (False, True):
            with pytest.raises(FileExistsError) as e:
                model.save(other, overwrite=overwrite)
            assert f"holds {what}" in str(e.value) and "not replaced" in str(e.value)
        assert other.read_bytes() == before
    model.save(path)  # a fit model is replaced


def test_save_refuses_a_fifo(tmp_path):
    """PY56: as the command line's --out, a FIFO is no place for a model file."""
    model = textnet.Sequential(SPEC, device="cpu")
    fifo = tmp_path / "f.st"
    os.mkfifo(fifo)
    for overwrite in (False, True):
        with pytest.raises(ValueError) as e:
            model.save(fifo, overwrite=overwrite)
        assert "is not a regular file" in str(e.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_save_refuses_a_file_a_textnet_run_writes(binary, tmp_path):
    """PY61: save takes the --out lock of the command line; a run stopped (SIGSTOP) once it trains holds it."""
    table = tmp_path / "t.csv"
    table.write_text("x1,x2,label\n" + "".join(f"{i % 7},{i % 5},{'ab'[i % 2]}\n" for i in range(400)))
    path = tmp_path / "m.st"
    run = subprocess.Popen(
        [binary, "fit", "--device", "cpu", "--table", table, "--target", "label", "--layers", "Linear(2)",
         "--epochs", "100000", "--out", path],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        for line in run.stdout:
            if line.startswith("epoch 1/"):
                run.send_signal(signal.SIGSTOP)
                break
        model = textnet.Sequential("Linear(2, 2)", device="cpu")
        with pytest.raises(ValueError) as e:
            model.save(path, overwrite=True)
        assert f"is being written by another textnet run (process {run.pid})" in str(e.value)
    finally:
        run.kill()
        run.wait()
    model.save(path, overwrite=True)  # the lock went with the run


def test_two_threads_saving_one_path_never_fail(tmp_path):
    """PY58: saves of one process wait for each other; the file is always a whole model."""
    model = textnet.Sequential(SPEC, device="cpu")
    path = tmp_path / "m.st"
    errors = []

    def save_20_times():
        for _ in range(20):
            try:
                model.save(path, overwrite=True)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=save_20_times) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert textnet.load(path).spec == model.spec
    assert [p.name for p in tmp_path.iterdir()] == ["m.st"]
