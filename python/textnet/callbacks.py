"""``textnet.callbacks``: what ``Sequential.fit(callbacks=[...])`` calls around each epoch, as Keras's
``keras.callbacks`` does: ``EarlyStopping``, ``ModelCheckpoint``, ``LearningRateScheduler``,
``ReduceLROnPlateau``, ``CSVLogger``, and ``Callback`` to write one's own.

Training runs in textnet's native epoch loop, which waits for the callbacks at each epoch's start and
end: ``on_epoch_begin`` may set the epoch's learning rate (``self.model.learning_rate``), and
``on_epoch_end`` sees the model holding that epoch's parameters (``self.model.save``, ``predict``, …
work there), may set the next epochs' rate, and may end the run (``self.model.stop_training = True``).

Per-batch hooks (``on_train_batch_begin`` and ``on_train_batch_end``) run on the CPU only: a GPU runs a
whole epoch as one captured graph, so ``fit`` on a GPU with a callback that defines them raises
``NotImplementedError``. The loop waits for them only when some callback defines them; ``stop_training``
set there ends the run after the epoch.
"""

import csv
import inspect
import math
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

__all__ = ["Callback", "EarlyStopping", "ModelCheckpoint", "LearningRateScheduler", "ReduceLROnPlateau", "CSVLogger"]

Logs = Dict[str, float]


class Callback:
    """The base of every callback: override the methods wanted. ``self.model`` is the ``Sequential``
    being trained; ``self.params`` holds ``epochs``, ``steps`` (optimizer steps per epoch), ``verbose``
    and ``metrics`` (the keys each epoch's ``logs`` will hold). Epochs are numbered from 0, as in Keras.
    """

    def __init__(self) -> None:
        self.model: Any = None
        self.params: Dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: Dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs: Optional[Logs] = None) -> None:
        """Before the first epoch."""

    def on_train_end(self, logs: Optional[Logs] = None) -> None:
        """After the last epoch (also after Ctrl-C or a divergence, before ``fit`` raises), with the last
        epoch's logs."""

    def on_epoch_begin(self, epoch: int, logs: Optional[Logs] = None) -> None:
        """Before epoch ``epoch`` trains."""

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        """After epoch ``epoch``: ``logs`` holds its ``loss``, ``accuracy`` or ``mae`` when the model's
        metrics ask for them, the ``val_`` figures with validation data, and ``seconds``."""

    def on_train_batch_begin(self, batch: int, logs: Optional[Logs] = None) -> None:
        """Before batch ``batch`` (from 0 in each epoch) trains; on the CPU only (module comment)."""
        self.on_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: Optional[Logs] = None) -> None:
        """After batch ``batch`` trained: ``logs`` holds ``loss``, the mean loss of the epoch's samples so
        far (as Keras's running mean); on the CPU only (module comment)."""
        self.on_batch_end(batch, logs)

    def on_batch_begin(self, batch: int, logs: Optional[Logs] = None) -> None:
        """Keras's older name of ``on_train_batch_begin``."""

    def on_batch_end(self, batch: int, logs: Optional[Logs] = None) -> None:
        """Keras's older name of ``on_train_batch_end``."""


def wants_batches(callback: Callback) -> bool:
    """Whether ``callback`` defines a per-batch hook (so the loop must stop for it at every batch)."""
    hooks = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
    return any(getattr(type(callback), hook) is not getattr(Callback, hook) for hook in hooks)


def _monitored(callback: str, monitor: str, params: Dict[str, Any]) -> None:
    """Refuses a ``monitor`` that the epochs' logs will not hold."""
    keys = params.get("metrics")
    if keys is not None and monitor not in keys:
        hint = " (give validation_data or validation_split)" if monitor.startswith("val_") else ""
        raise ValueError(
            f"{callback} monitors {monitor!r}, which this fit does not log{hint}: it logs {', '.join(keys)}"
        )


def _better(mode: str, monitor: str) -> Callable[[float, float], bool]:
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode must be auto, min or max, got {mode!r}")
    if mode == "max" or (mode == "auto" and ("acc" in monitor or "auc" in monitor)):
        return lambda value, best: value > best
    return lambda value, best: value < best


class EarlyStopping(Callback):
    """Stops training once ``monitor`` (``"val_loss"`` by default) has not improved by more than
    ``min_delta`` for ``patience`` epochs. ``mode``: ``"min"``, ``"max"``, or ``"auto"`` (max for
    accuracies, else min). ``baseline``: a value to beat from the start. ``restore_best_weights``: the
    model ends with the parameters of the best epoch rather than the last. ``start_from_epoch``: epochs to
    train before watching. ``stopped_epoch`` is the epoch after which it stopped (0 if it did not)."""

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        verbose: int = 0,
        mode: str = "auto",
        baseline: Optional[float] = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ) -> None:
        super().__init__()
        if patience < 0 or start_from_epoch < 0:
            raise ValueError("patience and start_from_epoch must be at least 0")
        self.monitor, self.patience, self.verbose, self.baseline = monitor, int(patience), verbose, baseline
        self.min_delta, self.restore_best_weights = abs(float(min_delta)), restore_best_weights
        self.start_from_epoch = int(start_from_epoch)
        self._better = _better(mode, monitor)
        self.sign = 1.0 if self._better(1.0, 0.0) else -1.0

    def on_train_begin(self, logs: Optional[Logs] = None) -> None:
        _monitored("EarlyStopping", self.monitor, self.params)
        self.wait, self.stopped_epoch, self.best_epoch = 0, 0, 0
        self.best = -self.sign * math.inf if self.baseline is None else float(self.baseline)
        self.best_weights: Optional[Dict[str, np.ndarray]] = None

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        value = (logs or {}).get(self.monitor)
        if value is None or epoch < self.start_from_epoch:
            return
        if self._better(value - self.sign * self.min_delta, self.best):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best_weights:
                self.best_weights = self.model.state_dict()
            return
        self.wait += 1
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: Optional[Logs] = None) -> None:
        if self.stopped_epoch and self.verbose:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping", flush=True)
        if self.best_weights is not None:
            if self.verbose:
                print(f"Restoring the parameters of the best epoch: {self.best_epoch + 1}", flush=True)
            self.model.load_state_dict(self.best_weights)


class ModelCheckpoint(Callback):
    """Writes the model file (``Sequential.save``) after each epoch to ``filepath``, which may name the
    epoch and the logs: ``"ckpt-{epoch:02d}-{val_loss:.3f}.safetensors"`` (epochs from 1 there, as in
    Keras). ``save_best_only``: only when ``monitor`` improves (``mode`` as in ``EarlyStopping``), so a
    fixed ``filepath`` ends holding the best epoch. A file there is replaced."""

    def __init__(
        self,
        filepath: Any,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        mode: str = "auto",
        initial_value_threshold: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.filepath, self.monitor, self.verbose = os.fspath(filepath), monitor, verbose
        self.save_best_only = save_best_only
        self._better = _better(mode, monitor)
        self.initial_value_threshold = initial_value_threshold

    def on_train_begin(self, logs: Optional[Logs] = None) -> None:
        if self.save_best_only:
            _monitored("ModelCheckpoint", self.monitor, self.params)
        self.best: Optional[float] = self.initial_value_threshold

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        logs = logs or {}
        try:
            path = self.filepath.format(epoch=epoch + 1, **logs)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} cannot be filled from {sorted(logs)}: {e}"
            ) from None
        if self.save_best_only:
            value = logs[self.monitor]
            if self.best is not None and not self._better(value, self.best):
                return
            self.best = value
        self.model.save(path, overwrite=True)
        if self.verbose:
            print(f"Epoch {epoch + 1}: saved the model to {path}", flush=True)


def _positional_arguments(function: Callable[..., Any]) -> float:
    """How many positional arguments ``function`` takes (infinity for ``*args`` or an unknown signature)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return math.inf
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return math.inf
    return sum(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)


class LearningRateScheduler(Callback):
    """Sets each epoch's learning rate to ``schedule(epoch, lr)`` (``lr``: the rate so far; a function of
    the epoch alone is taken too), for every step of the epoch. Each epoch's rate goes into its logs as
    ``learning_rate``. It replaces ``fit``'s ``lr_schedule``, so the two are not given together."""

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise ValueError("schedule must be a function schedule(epoch, lr) -> lr")
        self.schedule, self.verbose = schedule, verbose
        self._takes_rate = _positional_arguments(schedule) >= 2

    def on_epoch_begin(self, epoch: int, logs: Optional[Logs] = None) -> None:
        if self._takes_rate:
            self.model.learning_rate = self.schedule(epoch, self.model.learning_rate)
        else:
            self.model.learning_rate = self.schedule(epoch)
        if self.verbose:
            print(f"Epoch {epoch + 1}: LearningRateScheduler setting learning rate to {self.model.learning_rate}.")

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(self.model.learning_rate)


class ReduceLROnPlateau(Callback):
    """Multiplies the learning rate by ``factor`` once ``monitor`` has not improved for ``patience``
    epochs, as Keras's: improving means beating the best so far by more than ``min_delta`` (``mode``
    as in ``EarlyStopping``); after a reduction ``cooldown`` epochs pass before epochs count again; the
    rate never goes below ``min_lr``. The new rate holds from the next epoch on; each epoch's rate goes
    into its logs as ``learning_rate``. It sets the rate itself, so ``fit``'s ``lr_schedule`` and
    ``warmup`` are not given with it."""

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 < factor < 1:
            raise ValueError(f"ReduceLROnPlateau: factor must be between 0 and 1 (exclusive), got {factor!r}")
        if patience < 0 or cooldown < 0 or min_lr < 0:
            raise ValueError("ReduceLROnPlateau: patience, cooldown and min_lr must be at least 0")
        self.monitor, self.factor, self.patience, self.verbose = monitor, float(factor), int(patience), verbose
        self.min_delta, self.cooldown, self.min_lr = abs(float(min_delta)), int(cooldown), float(min_lr)
        better = _better(mode, monitor)
        self.sign = 1.0 if better(1.0, 0.0) else -1.0

    def on_train_begin(self, logs: Optional[Logs] = None) -> None:
        _monitored("ReduceLROnPlateau", self.monitor, self.params)
        self.best, self.wait, self.cooldown_counter = -self.sign * math.inf, 0, 0

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        logs = logs if logs is not None else {}
        rate = float(self.model.learning_rate)
        logs["learning_rate"] = rate
        value = logs.get(self.monitor)
        if value is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.sign * (value - self.best) > self.min_delta:
            self.best, self.wait = value, 0
        elif self.cooldown_counter == 0:
            self.wait += 1
            if self.wait >= self.patience and rate > self.min_lr:
                self.model.learning_rate = max(rate * self.factor, self.min_lr)
                self.cooldown_counter, self.wait = self.cooldown, 0
                if self.verbose:
                    print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {self.model.learning_rate}.",
                          flush=True)


class CSVLogger(Callback):
    """Writes each epoch's logs to the CSV file ``filename``: a header ``epoch,<keys>`` then a row per
    epoch (from 0, as Keras writes them), flushed as it goes. ``append``: add to an existing file (the
    header only when it is empty)."""

    def __init__(self, filename: Any, separator: str = ",", append: bool = False) -> None:
        super().__init__()
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._file: Any = None
        self._writer: Any = None
        self._keys: List[str] = []

    def on_train_begin(self, logs: Optional[Logs] = None) -> None:
        has_rows = self.append and os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        self._file = open(self.filename, "a" if self.append else "w", newline="")
        self._writer, self._keys, self._header = None, [], not has_rows

    def on_epoch_end(self, epoch: int, logs: Optional[Logs] = None) -> None:
        logs = logs or {}
        if self._writer is None:
            self._keys = sorted(logs)
            self._writer = csv.DictWriter(self._file, fieldnames=["epoch", *self._keys], delimiter=self.separator)
            if self._header:
                self._writer.writeheader()
        self._writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self._keys}})
        self._file.flush()

    def on_train_end(self, logs: Optional[Logs] = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
