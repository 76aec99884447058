"""Sequential: building it, fit / evaluate / predict, History, and the same training as `textnet fit`."""

import json

import numpy as np
import pytest

import textnet

SPEC = "Linear(784, 32), ReLU, Linear(32, 10)"


def test_layers_and_spec_text_build_the_same_network():
    from_layers = textnet.Sequential([textnet.Linear(784, 32), textnet.ReLU(), textnet.Linear(32, 10)])
    from_text = textnet.Sequential(SPEC)
    assert from_layers.spec == from_text.spec == "Linear(784, 32), ReLU, Linear(32, 10)"
    assert from_layers.count_params() == 784 * 32 + 32 + 32 * 10 + 10
    for name, a in from_layers.state_dict().items():
        assert np.array_equal(a, from_text.state_dict()[name])
    layers = [
        textnet.Conv2d(1, 4, 3, padding=1),
        textnet.ReLU(),
        textnet.MaxPool2d(2),
        textnet.Flatten(),
        textnet.Dropout(0.25),
        textnet.Linear(16),
        textnet.GELU(),
        textnet.Sigmoid(),
        textnet.Tanh(),
        textnet.Linear(10, bias=False),
    ]
    cnn = textnet.Sequential(layers, input_shape=(1, 28, 28))
    assert cnn.spec.startswith("Conv2d(1, 4, 3, stride=1, padding=1), ReLU, MaxPool2d(2), Flatten, Dropout(0.25)")
    assert cnn.spec.endswith("Linear(16, 10, bias=false)")
    assert cnn.input_shape == (1, 28, 28)
    table = []
    cnn.summary(print_fn=table.append)
    assert f"Total params: {cnn.count_params():,} (" in "\n".join(table)
    assert repr(textnet.ReLU()) == "textnet.ReLU"


def test_fit_learns_and_returns_a_keras_history(small, capsys):
    X, y, X_test, y_test = small
    model = textnet.Sequential(SPEC, device="cpu")
    history = model.fit(X, y, epochs=3, batch_size=32, validation_split=0.1, verbose=2)
    assert history.epoch == [0, 1, 2]
    assert set(history.history) == {"loss", "val_loss", "val_accuracy", "seconds"}
    assert all(len(v) == 3 for v in history.history.values())
    assert history.history["loss"][2] < history.history["loss"][0]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[2].startswith("Epoch 3/3 - ") and "val_accuracy: " in lines[2]
    model.compile(metrics=["accuracy"])
    scores = model.evaluate(X_test, y_test, return_dict=True)
    assert set(scores) == {"loss", "accuracy"}
    assert scores["accuracy"] > 0.7
    probabilities = model.predict(X_test)
    assert probabilities.shape == (1000, 10) and probabilities.dtype == np.float32
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    classes = model.predict_classes(X_test)
    assert classes.dtype == np.int64
    assert np.array_equal(classes, probabilities.argmax(axis=1))
    assert np.mean(classes == y_test) == pytest.approx(scores["accuracy"])


def test_validation_data_is_measured_every_epoch(small):
    X, y, X_test, y_test = small
    model = textnet.Sequential(SPEC, device="cpu")
    history = model.fit(X, y, epochs=2, validation_data=(X_test, y_test), verbose=0)
    model.compile(metrics=["accuracy"])
    last = model.evaluate(X_test, y_test, return_dict=True)
    assert history.history["val_loss"][-1] == pytest.approx(last["loss"], rel=1e-6)
    assert history.history["val_accuracy"][-1] == pytest.approx(last["accuracy"])


def test_the_same_training_as_textnet_fit_gives_the_same_parameters(fashion, cli, tmp_path):
    X, y, _, _ = fashion
    out = tmp_path / "cli.safetensors"
    done = cli("fit", "--layers", SPEC, "--dataset", "fashion", "--train-limit", 2000, "--epochs", 2,
               "--val-split", 0.1, "--device", "cpu", "--batch", 32, "--seed", 7, "-o", out, "--json")
    report = json.loads(done.stdout)
    model = textnet.Sequential(SPEC, device="cpu", seed=7)
    history = model.fit(X[:2000], y[:2000], epochs=2, batch_size=32, validation_split=0.1, verbose=0)
    from_cli = textnet.load(out)
    for name, value in model.state_dict().items():
        assert np.array_equal(value, from_cli.state_dict()[name]), name
    assert history.history["val_loss"][-1] == pytest.approx(report["epochs"][-1]["val_loss"], rel=1e-9)


def test_other_dtypes_and_layouts_are_converted(small):
    X, y, X_test, _ = small
    reference = textnet.Sequential(SPEC, device="cpu")
    reference.fit(X[:500], y[:500], epochs=1, verbose=0)
    converted = textnet.Sequential(SPEC, device="cpu")
    fortran = np.asfortranarray(X[:500].astype(np.float64))
    assert not fortran.flags["C_CONTIGUOUS"]
    converted.fit(fortran, y[:500].astype(np.uint8), epochs=1, verbose=0)
    for name, value in reference.state_dict().items():
        assert np.array_equal(value, converted.state_dict()[name])
    assert np.array_equal(reference.predict(X_test[::-1]), reference.predict(np.ascontiguousarray(X_test[::-1])))
    labels_as_floats = textnet.Sequential(SPEC, device="cpu")
    labels_as_floats.fit(X[:500], y[:500].astype(np.float32), epochs=1, verbose=0)
    assert np.array_equal(labels_as_floats.state_dict()["0.weight"], reference.state_dict()["0.weight"])


def test_a_regression_model_reports_mae(small):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 5)).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5, 0.0, 3.0], dtype=np.float32) + 0.1
    model = textnet.Sequential("Linear(5, 16), Tanh, Linear(16, 1)", loss="mse", device="cpu", lr=0.01)
    history = model.fit(X, y, epochs=20, validation_split=0.2, verbose=0)
    assert "val_mae" in history.history
    model.compile(metrics=["mae"])
    scores = model.evaluate(X, y, return_dict=True)
    assert set(scores) == {"loss", "mae"} and scores["mae"] < 0.5
    assert model.predict(X).shape == (600, 1)
    with pytest.raises(ValueError, match="predict_classes"):
        model.predict_classes(X)


def test_a_cnn_takes_images(small):
    X, y, X_test, y_test = small
    images = X[:400].reshape(-1, 1, 28, 28)
    model = textnet.Sequential("Conv2d(1, 4, 3), ReLU, MaxPool2d(2), Flatten, Linear(10)", device="cpu")
    model.fit(images, y[:400], epochs=1, verbose=0)
    assert model.input_shape == (1, 28, 28)
    assert model.predict(X_test[:10].reshape(-1, 1, 28, 28)).shape == (10, 10)
    assert model.predict(X_test[:10]).shape == (10, 10)  # rows of 784 values are read as the image


def test_progress_is_one_line_per_epoch_when_stderr_is_not_a_terminal(small, capsys):
    X, y, _, _ = small
    textnet.Sequential(SPEC, device="cpu").fit(X[:1000], y[:1000], epochs=2, verbose=1)
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("Epoch 2/2 - 1,000/1,000 - ") and captured.out.endswith("\n")


def test_history_plot_draws_a_png(small, tmp_path):
    X, y, _, _ = small
    history = textnet.Sequential(SPEC, device="cpu").fit(X[:1000], y[:1000], epochs=2, validation_split=0.2, verbose=0)
    path = tmp_path / "curve.png"
    figure = history.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [a.get_title() for a in figure.axes] == ["loss", "validation accuracy"]


def test_neural_network_gpu_prints_one_short_line_per_epoch(small, capsys):
    X_train, y_train, X_test, y_test = small
    from textnet import NeuralNetworkGPU

    nn = NeuralNetworkGPU(784, 128, 10)
    nn.fit(X_train, y_train, epochs=3)
    accuracy = nn.evaluate(X_test, y_test)
    lines = capsys.readouterr().out.strip().splitlines()
    last = lines[-1]
    assert last.startswith("Epoch 3/3 - Loss ") and " - Val Acc " in last and last.endswith("%")
    assert isinstance(accuracy, float) and accuracy > 0.75
    assert nn.predict(X_test[:5]).shape == (5,)


def test_neural_network_gpu_saves_a_model_file(small, tmp_path):
    X_train, y_train, X_test, _ = small
    nn = textnet.NeuralNetworkGPU(784, 16, 10, device="cpu")
    assert not nn.model.history
    nn.fit(X_train[:500], y_train[:500], epochs=1, verbose=0)
    nn.save(tmp_path / "two_layer.safetensors")
    loaded = textnet.load(tmp_path / "two_layer.safetensors")
    assert loaded.built and loaded.input_shape == (784,)
    assert loaded.count_params() == 12_730
    assert np.array_equal(loaded.predict_classes(X_test[:50]), nn.predict(X_test[:50]))


def test_help_says_what_the_readme_says():
    doc = textnet.Sequential.fit.__doc__
    for words in ("validation_split", "KeyboardInterrupt", "float32", "terminal", "callbacks"):
        assert words in doc
    assert "PyTorch" in textnet.Sequential.state_dict.__doc__


def test_a_schedule_changes_the_run_and_a_constant_one_is_the_default():
    """lr_schedule, warmup and min_lr reach the native loop: cosine to a floor trains differently from
    the default constant rate, and "constant" is that default."""
    from conftest import random_samples

    X, y = random_samples(n=256, features=20)

    def train(**schedule):
        model = textnet.Sequential("Linear(20, 16), ReLU, Linear(16, 10)", device="cpu", seed=5)
        return model.fit(X, y, epochs=3, batch_size=32, verbose=0, **schedule).history["loss"]

    default = train()
    assert train(lr_schedule="constant") == default
    cosine = train(lr_schedule="cosine", warmup=4, min_lr=1e-5)
    assert len(cosine) == 3 and cosine != default


def test_patience_stops_when_the_validation_loss_stops_improving():
    from conftest import random_samples

    X, y = random_samples(n=300, features=20)
    X_val, y_val = random_samples(n=100, features=20, seed=1)
    model = textnet.Sequential("Linear(20, 32), ReLU, Linear(32, 10)", device="cpu", optimizer="sgd", lr=0.5)
    history = model.fit(X, y, epochs=40, validation_data=(X_val, y_val), patience=2, verbose=0)
    val = history.history["val_loss"]
    best = val.index(min(val))
    # Random labels: the validation loss stops improving long before 40 epochs.
    assert len(val) < 40
    assert len(val) - 1 - best == 2, val


def test_bad_schedule_and_patience_arguments_are_refused():
    from conftest import random_samples

    X, y = random_samples(n=64, features=20)
    model = textnet.Sequential("Linear(20, 10)", device="cpu")
    with pytest.raises(ValueError, match="lr_schedule"):
        model.fit(X, y, epochs=1, lr_schedule="linear", verbose=0)
    with pytest.raises(ValueError, match="min_lr"):
        model.fit(X, y, epochs=1, lr_schedule="step", min_lr=1e-5, verbose=0)
    with pytest.raises(ValueError, match="warmup"):
        model.fit(X, y, epochs=1, warmup=100, verbose=0)
    with pytest.raises(ValueError, match="validation"):
        model.fit(X, y, epochs=2, patience=1, verbose=0)
