"""Keras habits in `Sequential`: compile, callbacks around the native epoch loop, summary's table, the
training accuracy in the history, one-hot labels, channels-last images, and the progress bar's output."""

import csv
import io

import numpy as np
import pytest

import textnet
from textnet.callbacks import (
    Callback,
    CSVLogger,
    EarlyStopping,
    LearningRateScheduler,
    ModelCheckpoint,
    ReduceLROnPlateau,
)

SPEC = "Linear(8, 16), ReLU, Linear(16, 3)"


def blobs(n=300, seed=0):
    """Three Gaussian clusters in 8 dimensions: learnable in a few epochs."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    centres = rng.normal(scale=3.0, size=(3, 8))
    return (centres[y] + rng.normal(size=(n, 8))).astype(np.float32), y


def model(**kwargs):
    return textnet.Sequential(SPEC, device="cpu", **kwargs)


class Recorder(Callback):
    """Every call, and the parameters the model holds at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.calls, self.params_at_end = [], []

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, sorted(logs)))
        self.params_at_end.append(self.model.state_dict())

    def on_train_end(self, logs=None):
        self.calls.append(("train_end", sorted(logs)))


def same_params(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


# -- compile and the training accuracy


def test_compile_sets_optimizer_loss_and_metrics_and_the_history_has_the_training_accuracy():
    X, y = blobs()
    m = model()
    m.compile(optimizer="SGD", loss="sparse_categorical_crossentropy", metrics=["accuracy"], learning_rate=0.05)
    assert (m.optimizer, m.loss, m.metrics, m.lr) == ("sgd", "ce", ["accuracy"], 0.05)
    history = m.fit(X, y, epochs=3, batch_size=32, validation_split=0.2, verbose=0)
    assert list(history.history) == ["loss", "accuracy", "val_loss", "val_accuracy", "seconds"]
    # The training figure is the model at the epoch's end on the samples it trained on (the first 240).
    assert history.history["accuracy"][-1] == pytest.approx(m.evaluate(X[:240], y[:240])[1])
    assert history.history["val_accuracy"][-1] == pytest.approx(m.evaluate(X[240:], y[240:])[1])
    # The same run through the constructor's arguments gives the same parameters.
    same = model(optimizer="sgd", lr=0.05)
    same.fit(X, y, epochs=3, batch_size=32, validation_split=0.2, verbose=0)
    assert same_params(same.state_dict(), m.state_dict())


def test_compile_of_a_regression_logs_the_training_mae_and_refuses_a_misfit():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 8)).astype(np.float32)
    y = X @ rng.normal(size=8).astype(np.float32)
    m = textnet.Sequential("Linear(8, 8), Tanh, Linear(8, 1)", device="cpu")
    m.compile(optimizer="adam", loss="mean_squared_error", metrics=["mae"])
    assert m.loss == "mse" and m.predict(X).shape == (200, 1)  # redrawn as a model of values
    history = m.fit(X, y, epochs=2, verbose=0)
    assert history.history["mae"][-1] == pytest.approx(m.evaluate(X, y, return_dict=True)["mae"], rel=1e-5)
    with pytest.raises(ValueError, match="trained with loss 'mse'"):
        m.compile(loss="categorical_crossentropy")
    with pytest.raises(ValueError, match="does not fit loss"):
        model().compile(metrics=["mae"])
    with pytest.raises(ValueError, match="metrics may hold"):
        model().compile(metrics=["f1"])
    with pytest.raises(ValueError, match="loss must be one of"):
        model().compile(loss="hinge")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        model().compile(optimizer="rmsprop")


# -- callbacks


def test_callbacks_are_called_in_order_and_see_each_epochs_parameters():
    X, y = blobs()
    recorder = Recorder()
    m = model(metrics=["accuracy"])
    m.fit(X, y, epochs=3, validation_split=0.2, verbose=0, callbacks=[recorder])
    keys = ["accuracy", "loss", "seconds", "val_accuracy", "val_loss"]
    assert recorder.calls == [
        ("train_begin",),
        *[call for e in range(3) for call in (("epoch_begin", e), ("epoch_end", e, keys))],
        ("train_end", keys),
    ]
    assert recorder.params == {
        "epochs": 3,
        "verbose": 0,
        "metrics": ["loss", "accuracy", "val_loss", "val_accuracy", "seconds"],
    }
    first, second, last = recorder.params_at_end
    assert not same_params(first, second) and not same_params(second, last)
    assert same_params(last, m.state_dict())


def test_a_callback_stops_training_and_its_exception_ends_it():
    X, y = blobs()

    class StopAfterTwo(Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    assert model().fit(X, y, epochs=10, verbose=0, callbacks=[StopAfterTwo()]).epoch == [0, 1]

    class Fails(Recorder):
        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == 1:
                raise ArithmeticError("from the callback")

    fails = Fails()
    with pytest.raises(ArithmeticError, match="from the callback"):
        model().fit(X, y, epochs=10, verbose=0, callbacks=[fails])
    assert [c[0] for c in fails.calls].count("epoch_begin") == 2
    with pytest.raises(ValueError, match="Callback objects"):
        model().fit(X, y, epochs=1, verbose=0, callbacks=[print])


def test_early_stopping_stops_after_patience_and_restores_the_best_parameters():
    X, y = blobs()
    recorder = Recorder()
    # The loss falls every epoch, so watched for a rise it is best at the first epoch.
    stop = EarlyStopping(monitor="loss", mode="max", patience=2, restore_best_weights=True)
    m = model()
    history = m.fit(X, y, epochs=10, verbose=0, callbacks=[recorder, stop])
    assert history.epoch == [0, 1, 2] and stop.stopped_epoch == 2 and stop.best_epoch == 0
    assert same_params(m.state_dict(), recorder.params_at_end[0])
    # Watched as it should be, it does not stop a run that keeps improving.
    kept = model().fit(X, y, epochs=4, verbose=0, callbacks=[EarlyStopping(monitor="loss", patience=1)])
    assert len(kept.epoch) == 4
    with pytest.raises(ValueError, match="monitors 'val_loss'.*validation_data"):
        model().fit(X, y, epochs=1, verbose=0, callbacks=[EarlyStopping()])


def test_model_checkpoint_writes_each_epoch_or_the_best(tmp_path):
    X, y = blobs()
    recorder = Recorder()
    every = ModelCheckpoint(tmp_path / "m-{epoch:02d}-{loss:.3f}.safetensors", monitor="loss")
    best = ModelCheckpoint(tmp_path / "best.safetensors", monitor="loss", mode="max", save_best_only=True)
    m = model()
    history = m.fit(X, y, epochs=3, verbose=0, callbacks=[recorder, every, best])
    names = sorted(p.name for p in tmp_path.glob("m-*"))
    assert names == [f"m-{e + 1:02d}-{loss:.3f}.safetensors" for e, loss in enumerate(history.history["loss"])]
    for path, params in zip(sorted(tmp_path.glob("m-*")), recorder.params_at_end):
        assert same_params(textnet.load(path).state_dict(), params)
    assert same_params(textnet.load(tmp_path / "best.safetensors").state_dict(), recorder.params_at_end[0])
    with pytest.raises(ValueError, match="cannot be filled"):
        model().fit(X, y, epochs=1, verbose=0, callbacks=[ModelCheckpoint(tmp_path / "{val_loss}.st")])


def test_learning_rate_scheduler_sets_each_epochs_rate():
    X, y = blobs()
    rates = []

    def schedule(epoch, lr):
        rates.append(lr)
        return lr if epoch == 0 else 1e-30

    recorder = Recorder()
    m = model()
    history = m.fit(X, y, epochs=3, verbose=0, callbacks=[recorder, LearningRateScheduler(schedule)])
    assert rates == pytest.approx([0.001, 0.001, 1e-30], rel=1e-6)
    assert history.history["learning_rate"] == pytest.approx([0.001, 1e-30, 1e-30], rel=1e-6)
    first, second, third = recorder.params_at_end
    for name in first:  # at a rate of 1e-30 nothing moves
        assert np.allclose(first[name], second[name], rtol=0, atol=1e-12)
        assert np.allclose(second[name], third[name], rtol=0, atol=1e-12)
    # A schedule that keeps the default rate trains as no schedule does; a function of the epoch is taken.
    plain = model()
    plain.fit(X, y, epochs=2, verbose=0)
    scheduled = model()
    scheduled.fit(X, y, epochs=2, verbose=0, callbacks=[LearningRateScheduler(lambda epoch: 0.001)])
    assert same_params(plain.state_dict(), scheduled.state_dict())
    with pytest.raises(ValueError, match="not both"):
        model().fit(X, y, epochs=2, verbose=0, lr_schedule="cosine", callbacks=[LearningRateScheduler(schedule)])
    with pytest.raises(ValueError, match="finite and above 0"):
        model().fit(X, y, epochs=2, verbose=0, callbacks=[LearningRateScheduler(lambda e: -1.0)])


def test_evaluate_returns_the_loss_alone_a_list_with_metrics_or_a_dict():
    X, y = blobs()
    plain = model()
    plain.fit(X, y, epochs=1, verbose=0)
    both = plain._measured(X, y, 1024)  # the loss and the accuracy, compiled or not
    loss = plain.evaluate(X, y)
    assert isinstance(loss, float) and loss == both["loss"]
    assert plain.evaluate(X, y, return_dict=True) == {"loss": both["loss"]}
    plain.compile(metrics=["accuracy"])
    assert plain.evaluate(X, y) == [both["loss"], both["accuracy"]]
    assert plain.evaluate(X, y, return_dict=True) == {"loss": both["loss"], "accuracy": both["accuracy"]}
    predicted = plain.predict_classes(X)
    assert both["accuracy"] == pytest.approx(np.mean(predicted == y))


def test_reduce_lr_on_plateau_multiplies_the_rate_by_factor_after_patience_epochs():
    X, y = blobs()
    # The loss falls every epoch, so watched for a rise it stalls from the second epoch on.
    plateau = ReduceLROnPlateau(monitor="loss", mode="max", factor=0.5, patience=1, min_lr=2e-4)
    m = model()
    history = m.fit(X, y, epochs=6, verbose=0, callbacks=[plateau])
    # Epoch 0 sets the best; epochs 1, 2, 3 each wait 1 ≥ patience and halve the rate for the next
    # epoch (1e-3 → 5e-4 → 2.5e-4 → min_lr 2e-4, not 1.25e-4); at min_lr it stays.
    lr = history.history["learning_rate"][0]  # the default 1e-3, as the run's f32 rates hold it
    assert lr == pytest.approx(1e-3, rel=1e-7)
    assert history.history["learning_rate"] == [lr, lr, lr * 0.5, lr * 0.5 * 0.5, 2e-4, 2e-4]
    assert m.learning_rate is None  # the run's rates do not outlive it
    # The epochs trained at those rates: a schedule of the same rates gives the same parameters.
    rates = history.history["learning_rate"]
    scheduled = model()
    scheduled.fit(X, y, epochs=6, verbose=0, callbacks=[LearningRateScheduler(lambda epoch: rates[epoch])])
    assert same_params(scheduled.state_dict(), m.state_dict())
    # Watched as it should be (the loss falls), it never reduces; cooldown skips epochs after a reduction.
    falling = model().fit(X, y, epochs=3, verbose=0, callbacks=[ReduceLROnPlateau(monitor="loss", patience=1)])
    assert falling.history["learning_rate"] == [lr] * 3
    cooled = ReduceLROnPlateau(monitor="loss", mode="max", factor=0.1, patience=1, cooldown=2)
    history = model().fit(X, y, epochs=6, verbose=0, callbacks=[cooled])
    # Reduced after epoch 1; epochs 2 and 3 cool down (the wait starts again at epoch 3, as in Keras).
    assert history.history["learning_rate"] == [lr, lr, lr * 0.1, lr * 0.1, lr * 0.1 * 0.1, lr * 0.1 * 0.1]
    with pytest.raises(ValueError, match="factor must be between 0 and 1"):
        ReduceLROnPlateau(factor=1.5)
    with pytest.raises(ValueError, match="monitors 'val_loss'"):
        model().fit(X, y, epochs=1, verbose=0, callbacks=[ReduceLROnPlateau()])
    with pytest.raises(ValueError, match="ReduceLROnPlateau sets the epochs' rate"):
        model().fit(X, y, epochs=2, verbose=0, lr_schedule="cosine", callbacks=[ReduceLROnPlateau(monitor="loss")])


class Batches(Callback):
    """Every per-batch call with its logs."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, dict(logs)))


def test_batch_hooks_run_around_every_batch_on_the_cpu_with_the_running_loss():
    X, y = blobs()  # 300 samples in batches of 64: 4 full batches and one of 44
    batches = Batches()
    m = model()
    history = m.fit(X, y, epochs=2, batch_size=64, verbose=0, callbacks=[batches])
    for epoch in range(2):
        calls = batches.calls[epoch * 11:(epoch + 1) * 11]
        assert calls[0] == ("epoch_begin", epoch)
        assert [c[:2] for c in calls[1:]] == [(kind, b) for b in range(5) for kind in ("begin", "end")]
        losses = [c[2]["loss"] for c in calls[1:] if c[0] == "end"]
        assert all(np.isfinite(losses)) and all(set(c[2]) == {"loss"} for c in calls[1:] if c[0] == "end")
        # The last batch's running mean is the epoch's loss.
        assert losses[-1] == history.history["loss"][epoch]
    # Watching every batch changes nothing in the training.
    plain = model()
    plain.fit(X, y, epochs=2, batch_size=64, verbose=0)
    assert same_params(plain.state_dict(), m.state_dict())

    class OldNames(Callback):
        def __init__(self):
            super().__init__()
            self.ends = 0

        def on_batch_end(self, batch, logs=None):
            self.ends += 1
            if batch == 1:
                self.model.stop_training = True  # ends the run after the epoch

    old = OldNames()
    assert model().fit(X, y, epochs=3, batch_size=64, verbose=0, callbacks=[old]).epoch == [0]
    assert old.ends == 5


def test_batch_hooks_on_a_gpu_are_not_implemented():
    try:
        textnet.zeros(1, device="cuda")
    except RuntimeError:
        pytest.skip("no GPU")
    X, y = blobs()
    with pytest.raises(NotImplementedError, match="CPU only"):
        textnet.Sequential(SPEC, device="cuda").fit(X, y, epochs=1, verbose=0, callbacks=[Batches()])


def test_csv_logger_writes_a_row_per_epoch(tmp_path):
    X, y = blobs()
    path = tmp_path / "log.csv"
    history = model().fit(X, y, epochs=3, validation_split=0.2, verbose=0, callbacks=[CSVLogger(path)])
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["epoch", "loss", "seconds", "val_accuracy", "val_loss"]
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(history.history["val_loss"])
    model().fit(X, y, epochs=2, validation_split=0.2, verbose=0, callbacks=[CSVLogger(path, append=True)])
    assert len(list(csv.DictReader(path.open()))) == 5


# -- summary


def test_summary_prints_a_table_of_layers_shapes_and_parameters(capsys):
    cnn = textnet.Sequential(
        "Conv2d(1, 4, 3), ReLU, MaxPool2d(2), Flatten, Linear(10)", input_shape=(1, 12, 12), device="cpu"
    )
    assert cnn.summary() is None
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out if line[:1].isdigit()}
    assert "(None, 4, 10, 10)" in rows["0:"] and rows["0:"].endswith(" 40")
    assert "(None, 4, 5, 5)" in rows["2:"] and rows["2:"].endswith(" 0")
    assert "(None, 100)" in rows["3:"] and "(None, 10)" in rows["4:"] and rows["4:"].endswith(" 1,010")
    assert f"Total params: {cnn.count_params():,} (" in "\n".join(out) and cnn.count_params() == 1050
    lines = []
    cnn.summary(print_fn=lines.append)
    assert lines == out
    with pytest.raises(ValueError, match="summary needs a trained or built model"):
        textnet.Sequential("Linear(10)").summary()


# -- one-hot labels and channels-last images


def test_one_hot_labels_train_as_class_labels_and_bad_rows_are_refused():
    X, y = blobs()
    one_hot = np.eye(3, dtype=np.float32)[y]
    by_label, by_one_hot = model(), model()
    by_label.fit(X, y, epochs=2, validation_data=(X[:50], y[:50]), verbose=0)
    by_one_hot.fit(X, one_hot, epochs=2, validation_data=(X[:50], one_hot[:50]), verbose=0)
    assert same_params(by_label.state_dict(), by_one_hot.state_dict())
    assert by_one_hot.evaluate(X, one_hot.astype(np.int32)) == by_label.evaluate(X, y)
    two_ones = one_hot.copy()
    two_ones[7, :] = 1
    with pytest.raises(ValueError, match=r"y\[7\] is not one-hot"):
        by_label.fit(X, two_ones, epochs=1, verbose=0)
    smoothed = one_hot * 0.9 + 0.05
    with pytest.raises(ValueError, match=r"y\[0\] is not one-hot"):
        by_label.evaluate(X, smoothed)
    with pytest.raises(ValueError, match="one-hot rows of 4 classes but the model has 3 outputs"):
        by_label.fit(X, np.eye(4)[y], epochs=1, verbose=0)


def test_channels_last_images_train_as_their_channels_first_twins():
    rng = np.random.default_rng(2)
    nchw = rng.random((120, 2, 8, 8), dtype=np.float32)
    y = np.arange(120) % 3
    nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    layers = "Conv2d(2, 4, 3), ReLU, Flatten, Linear(3)"
    first = textnet.Sequential(layers, device="cpu")
    first.fit(nchw, y, epochs=2, validation_data=(nchw[:20], y[:20]), verbose=0)
    last = textnet.Sequential(layers, device="cpu", data_format="channels_last")
    last.fit(nhwc, y, epochs=2, validation_data=(nhwc[:20], y[:20]), verbose=0)
    assert same_params(first.state_dict(), last.state_dict())
    assert last.input_shape == (2, 8, 8)
    assert np.array_equal(first.predict(nchw[:5]), last.predict(nhwc[:5]))
    assert first.evaluate(nchw, y) == last.evaluate(nhwc, y)
    by_layer = textnet.Sequential(
        [textnet.Conv2d(2, 4, 3, data_format="channels_last"), textnet.ReLU(), textnet.Flatten(), textnet.Linear(3)],
        device="cpu",
        input_shape=(8, 8, 2),
    )
    assert by_layer.data_format == "channels_last" and by_layer.input_shape == (2, 8, 8)
    with pytest.raises(ValueError, match='give data_format="channels_last"'):
        textnet.Sequential(layers, device="cpu").fit(nhwc, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="data_format must be"):
        textnet.Sequential(layers, data_format="nhwc")


# -- the progress bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_shows_the_count_rate_eta_and_last_loss_and_ends_at_the_real_count():
    screen = Terminal()
    bar = textnet.keras._Progress(2, verbose=1, stream=screen)
    bar.progress(1, 0, 6000)
    bar.epoch_started -= 2.0  # as if two seconds had passed
    bar.last_draw = 0.0
    bar.progress(1, 3000, 6000)
    assert "3,000/6,000" in screen.getvalue() and "1,500 samples/s" in screen.getvalue()
    assert "ETA 2s" in screen.getvalue()
    # A GPU epoch reports its samples when it ends, right after its start: the bar shows that count.
    bar.progress(1, 6000, 6000)
    assert "] 6,000/6,000 - " in screen.getvalue().split("\r")[-1]
    bar.epoch(1, {"loss": 0.25, "seconds": 4.0})
    bar.progress(2, 0, 6000)
    assert "last loss: 0.2500" in screen.getvalue().split("\r")[-1]
    assert "\x1b" not in screen.getvalue()


def test_progress_off_a_terminal_writes_plain_lines_without_control_characters(capsys):
    X, y = blobs()
    model(metrics=["accuracy"]).fit(X, y, epochs=2, batch_size=16, validation_split=0.2, verbose=1)
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert "\r" not in text and "\x1b" not in text
    lines = captured.out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("Epoch 2/2 - 240/240 - ")
    assert " samples/s - loss: " in lines[1] and " - accuracy: " in lines[1] and " - val_loss: " in lines[1]
    bar = textnet.keras._Progress(1, verbose=1, stream=io.StringIO())
    bar.progress(1, 0, 10)
    bar.progress(1, 10, 10)
    assert bar.stream.getvalue() == ""
