"""ONNX export (docs/onnx.md): a tiny MLP, CNN and Transformer, trained on the CPU, written by
``export_onnx`` and by ``textnet export --onnx``, checked by ``onnx.checker`` and run in onnxruntime on the
CPU, whose outputs must be textnet's own predictions to float32 rounding."""

import json

import numpy as np
import pytest

import textnet
from conftest import pgm

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

# float32 rounding of sums taken in another order (onnxruntime's kernels against textnet's CPU reference).
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def run_onnx(path, feeds):
    """Checks the file and runs it on the CPU: its outputs by name, and its metadata."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import] == [17]
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in runtime.get_outputs()]
    outputs = dict(zip(names, runtime.run(None, feeds)))
    return outputs, {p.key: p.value for p in model.metadata_props}


def both_exports(model, tmp_path, cli):
    """The ONNX files of ``model`` written by ``export_onnx`` and by ``textnet export`` from its saved file,
    which must hold the same bytes."""
    by_python = tmp_path / "python.onnx"
    model.export_onnx(by_python)
    model.save(tmp_path / "model.safetensors")
    by_cli = tmp_path / "cli.onnx"
    cli("export", "--onnx", by_cli, tmp_path / "model.safetensors")
    assert by_cli.read_bytes() == by_python.read_bytes()
    return by_python


def test_an_mlp_of_classes_gives_predict_s_probabilities(tmp_path, cli):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((240, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    model = textnet.Sequential("Linear(6, 16), GELU, Dropout(0.2), Linear(16, 8), Tanh, Linear(8, 3)",
                               device="cpu", seed=2, class_names=["a", "b", "c"])
    model.fit(X, y, epochs=3, batch_size=32, verbose=0)
    path = both_exports(model, tmp_path, cli)
    X_new = rng.standard_normal((37, 6)).astype(np.float32)  # a batch size the file never saw
    out, meta = run_onnx(path, {"input": X_new})
    assert set(out) == {"logits", "probabilities"}
    np.testing.assert_allclose(out["probabilities"], model.predict(X_new), **TOLERANCE)
    np.testing.assert_allclose(out["logits"], model._model.forward(X_new, device="cpu"), **TOLERANCE)
    assert json.loads(meta["class_names"]) == ["a", "b", "c"]


def test_a_regressor_gives_values_in_the_targets_units(tmp_path, cli):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((200, 4)).astype(np.float32)
    y = (100 + 20 * X[:, :1] - 5 * X[:, 1:2]).astype(np.float32)
    model = textnet.Sequential("Linear(4, 8), Sigmoid, Linear(8, 1)", loss="mse", device="cpu", seed=1)
    model.fit(X, y, epochs=3, batch_size=32, verbose=0)
    out, _ = run_onnx(both_exports(model, tmp_path, cli), {"input": X[:9]})
    assert set(out) == {"values"}
    np.testing.assert_allclose(out["values"], model.predict(X[:9]), rtol=1e-5, atol=1e-3)


def test_a_cnn_gives_predict_s_and_classify_s_probabilities(tmp_path, cli):
    rng = np.random.default_rng(5)
    X = rng.random((96, 1, 28, 28), dtype=np.float32)
    y = (X[:, 0, :14].mean(axis=(1, 2)) > X[:, 0, 14:].mean(axis=(1, 2))).astype(np.int64)
    spec = "Conv2d(1, 3, 3, padding=1), ReLU, MaxPool2d(2), Conv2d(3, 4, 3, stride=2), ReLU, MaxPool2d(3), Flatten, Linear(2)"
    model = textnet.Sequential(spec, device="cpu", seed=3)
    model.fit(X, y, epochs=2, batch_size=32, verbose=0)
    path = both_exports(model, tmp_path, cli)
    out, _ = run_onnx(path, {"input": X[:5]})
    np.testing.assert_allclose(out["probabilities"], model.predict(X[:5]), **TOLERANCE)

    # `textnet classify` reads images as bytes / 255: the same pixels go to onnxruntime.
    images = [pgm(tmp_path / f"{i}.pgm", X[i]) for i in range(3)]
    done = cli("classify", "--json", "--model", tmp_path / "model.safetensors", *images)
    pixels = np.stack([np.round(X[i] * 255) / 255 for i in range(3)]).astype(np.float32)
    probabilities = run_onnx(path, {"input": pixels})[0]["probabilities"]
    for row, prediction in zip(probabilities, json.loads(done.stdout)["predictions"]):
        assert int(np.argmax(row)) == prediction["class"]
        np.testing.assert_allclose(row[prediction["class"]], prediction["probability"], **TOLERANCE)


MNIST_FILES = {
    # textnet mnist's MLP: 784 → hidden → 10 under w1, b1, w2, b2.
    "mlp": ({"format": "textnet-mnist", "format_version": "1", "inputs": "784", "hidden": "12", "classes": "10",
             "activation": "tanh"},
            {"w1": (12, 784), "b1": (12,), "w2": (10, 12), "b2": (10,)}),
    # textnet mnist --model cnn: conv3x3 → ReLU → maxpool2, twice, then fc → ReLU → classes.
    "cnn": ({"format": "textnet-mnist-cnn", "side": "28", "c1": "2", "c2": "3", "fc": "8", "classes": "10"},
            {"conv1.weight": (2, 1, 3, 3), "conv1.bias": (2,), "conv2.weight": (3, 2, 3, 3), "conv2.bias": (3,),
             "fc1.weight": (8, 147), "fc1.bias": (8,), "fc2.weight": (10, 8), "fc2.bias": (10,)}),
}


@pytest.mark.parametrize("kind", sorted(MNIST_FILES))
def test_an_mnist_model_file_gives_classify_s_probabilities(kind, tmp_path, cli):
    from safetensors.numpy import save_file

    metadata, shapes = MNIST_FILES[kind]
    rng = np.random.default_rng(6)
    tensors = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32) for name, shape in shapes.items()}
    save_file(tensors, str(tmp_path / "mnist.safetensors"), metadata=metadata)
    path = tmp_path / "mnist.onnx"
    cli("export", "--onnx", path, tmp_path / "mnist.safetensors")
    X = rng.random((4, 784), dtype=np.float32)
    images = [pgm(tmp_path / f"{i}.pgm", X[i]) for i in range(len(X))]
    done = cli("classify", "--json", "--model", tmp_path / "mnist.safetensors", *images)
    pixels = (np.round(X * 255) / 255).astype(np.float32)
    shape = (-1, 784) if kind == "mlp" else (-1, 1, 28, 28)
    probabilities = run_onnx(path, {"input": pixels.reshape(shape)})[0]["probabilities"]
    for row, prediction in zip(probabilities, json.loads(done.stdout)["predictions"]):
        assert int(np.argmax(row)) == prediction["class"]
        np.testing.assert_allclose(row[prediction["class"]], prediction["probability"], **TOLERANCE)


def test_a_transformer_gives_its_logits_at_every_position(corpus, tmp_path, cli):
    out = tmp_path / "tf.safetensors"
    model = textnet.Transformer.train(corpus, steps=10, device="cpu", layers=2, embed=16, heads=2, block=16,
                                      batch=4, eval_every=5, quiet=True, out=out)
    by_python = tmp_path / "python.onnx"
    model.export_onnx(by_python)
    by_cli = tmp_path / "cli.onnx"
    cli("export", "--onnx", by_cli, out)
    assert by_cli.read_bytes() == by_python.read_bytes()

    texts = ["ROMEO: but soft", "To be, or not t"]  # two sequences of 15, one batch
    ids = np.array([model.encode(t) for t in texts], dtype=np.int64)
    outputs, meta = run_onnx(by_python, {"input_ids": ids})
    assert outputs["logits"].shape == (2, 15, len(json.loads(meta["vocab"])))
    for row, sequence in zip(outputs["logits"], ids):
        np.testing.assert_allclose(row, model.logits(sequence), **TOLERANCE)
    # A shorter sequence: the causal mask and the positions are sliced to its length.
    short = run_onnx(by_python, {"input_ids": ids[:1, :4]})[0]["logits"][0]
    np.testing.assert_allclose(short, model.logits(ids[0, :4]), **TOLERANCE)
    np.testing.assert_allclose(short, outputs["logits"][0, :4], **TOLERANCE)
    with pytest.raises(ValueError, match="block"):
        model.logits(list(ids[0]) * 2)


def test_bad_exports_raise(tmp_path):
    model = textnet.Sequential("Linear(3, 2)", device="cpu")
    with pytest.raises(IsADirectoryError):
        model.export_onnx(tmp_path)
    model.save(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="holds a model file"):
        model.export_onnx(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="built"):
        textnet.Sequential("ReLU").export_onnx(tmp_path / "unbuilt.onnx")
