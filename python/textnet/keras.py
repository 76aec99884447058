"""``textnet.keras``: networks written as layers (``Sequential``), trained with ``fit`` on NumPy arrays, in
the style of Keras, and the two-layer ``NeuralNetworkGPU``; the package's top level (``textnet.Sequential``,
``textnet.Linear``, …) holds these. ``textnet.nn`` is PyTorch's style instead: modules the user writes,
on tensors with autograd.

A ``Sequential`` is a ``textnet fit`` network: the same layers, the same CPU reference and fused GPU
kernels, the same initial parameters, shuffles and model files. Training the same spec on the same
samples with the same seed in Python and with ``textnet fit`` gives the same parameters.
"""

import math
import os
import re
import sys
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from .callbacks import Callback, LearningRateScheduler, ReduceLROnPlateau, wants_batches
from .tensorboard import SummaryWriter

__all__ = [
    "Layer",
    "Linear",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "Dropout",
    "Conv2d",
    "MaxPool2d",
    "Flatten",
    "Sequential",
    "History",
    "Callback",
    "load",
    "NeuralNetworkGPU",
]

PathLike = Union[str, "os.PathLike[str]"]


# ------------------------------------------------------------------------------------------------------
# Layers: each is its spec text, as torch.nn spells it.


class Layer:
    """A layer of a ``Sequential``; ``str(layer)`` is its spec text, e.g. ``Linear(784, 128)``."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"textnet.{self._text}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layer) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(self._text)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


class Linear(Layer):
    """``y = x Wᵀ + b`` (``nn.Linear``). ``Linear(out_features)`` takes its input width from the data or
    the layer before, as ``nn.LazyLinear`` does."""

    def __init__(self, in_features: int, out_features: Optional[int] = None, bias: bool = True) -> None:
        widths = (
            f"{_int(in_features, 'in_features')}"
            if out_features is None
            else f"{_int(in_features, 'in_features')}, {_int(out_features, 'out_features')}"
        )
        super().__init__(f"Linear({widths})" if bias else f"Linear({widths}, bias=false)")


class ReLU(Layer):
    """max(0, x)."""

    def __init__(self) -> None:
        super().__init__("ReLU")


class Sigmoid(Layer):
    """1 / (1 + e^−x)."""

    def __init__(self) -> None:
        super().__init__("Sigmoid")


class Tanh(Layer):
    """tanh(x)."""

    def __init__(self) -> None:
        super().__init__("Tanh")


class GELU(Layer):
    """GELU in its tanh form (``nn.GELU(approximate="tanh")``)."""

    def __init__(self) -> None:
        super().__init__("GELU")


class Dropout(Layer):
    """Zeroes each value with probability ``p`` while training (scaling the rest by 1/(1−p)); off in
    ``evaluate`` and ``predict``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(f"Dropout({float(p)!r})")


_DATA_FORMATS = ("channels_first", "channels_last")


def _data_format(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in _DATA_FORMATS:
        raise ValueError(f"data_format must be channels_first or channels_last, got {value!r}")
    return value


class Conv2d(Layer):
    """2-D convolution (``nn.Conv2d``); samples are (channels, height, width). ``data_format=
    "channels_last"`` makes the model read images as (height, width, channels), as Keras does (the
    ``Sequential``'s ``data_format``)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        data_format: Optional[str] = None,
    ) -> None:
        super().__init__(
            f"Conv2d({_int(in_channels, 'in_channels')}, {_int(out_channels, 'out_channels')}, "
            f"{_int(kernel_size, 'kernel_size')}, stride={_int(stride, 'stride')}, "
            f"padding={_int(padding, 'padding')})"
        )
        self.data_format = _data_format(data_format)


class MaxPool2d(Layer):
    """Max over k×k windows, stride k (``nn.MaxPool2d(k)``)."""

    def __init__(self, kernel_size: int) -> None:
        super().__init__(f"MaxPool2d({_int(kernel_size, 'kernel_size')})")


class Flatten(Layer):
    """(channels, height, width) → one row of values."""

    def __init__(self) -> None:
        super().__init__("Flatten")


# ------------------------------------------------------------------------------------------------------
# Input conversion


def _features(X: Any, what: str = "X") -> np.ndarray:
    """``X`` as a C-contiguous float32 array: other numeric dtypes are converted, non-contiguous arrays
    copied. Refuses non-numeric data."""
    array = np.asarray(X)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what} must hold numbers, got an array of dtype {array.dtype}")
    if array.ndim < 2:
        raise ValueError(f"{what} has shape {array.shape}: give one row per sample, shape (n, features)")
    return np.ascontiguousarray(array, dtype=np.float32)


def _one_hot(array: np.ndarray, what: str, classes: Optional[int]) -> np.ndarray:
    """The class of each one-hot row (0s and a single 1), as int64."""
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what} must hold numbers, got an array of dtype {array.dtype}")
    if classes is not None and array.shape[1] != classes:
        raise ValueError(
            f"{what} has one-hot rows of {array.shape[1]} classes but the model has {classes} outputs"
        )
    ones = array == 1
    bad = ~np.all(ones | (array == 0), axis=1) | (ones.sum(axis=1) != 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{what}[{i}] is not one-hot (0s and a single 1): give class labels, shape (n,), or one-hot rows, "
            f"shape (n, classes)"
        )
    return np.argmax(ones, axis=1).astype(np.int64)


def _labels(y: Any, what: str = "y", classes: Optional[int] = None) -> np.ndarray:
    """Class labels as int64: integer dtypes of any width, floats holding whole numbers, or one-hot rows
    (of ``classes`` columns when given)."""
    array = np.asarray(y)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    elif array.ndim == 2:
        return _one_hot(array, what, classes)
    if array.dtype.kind in "iub":
        return np.ascontiguousarray(array, dtype=np.int64)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{what} holds NaN or infinite labels")
        if not np.all(array == np.round(array)):
            raise ValueError(f"{what} holds labels that are not whole numbers: give class indices 0, 1, …")
        return np.ascontiguousarray(array, dtype=np.int64)
    raise ValueError(f"{what} must hold integer class labels, got an array of dtype {array.dtype}")


def _values(y: Any, outputs: int, what: str = "y") -> np.ndarray:
    array = np.asarray(y)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what} must hold numbers, got an array of dtype {array.dtype}")
    if outputs == 1 and array.ndim == 1:
        array = array[:, None]
    return np.ascontiguousarray(array, dtype=np.float32)


# ------------------------------------------------------------------------------------------------------
# History and progress


def _board_scalars(logs: Dict[str, float], samples_per_s: float, lr: float) -> Dict[str, float]:
    """An epoch's logs as the TensorBoard tags of ``textnet fit --tensorboard``: ``val_X`` as ``X/val``,
    the training figures (``loss``, ``accuracy``, ``mae``) as ``X/train``, then ``lr`` and
    ``samples_per_s`` (for the logs' ``seconds``)."""
    scalars = {}
    for key, value in logs.items():
        if key == "seconds":
            continue
        split, figure = ("val", key[4:]) if key.startswith("val_") else ("train", key)
        scalars[f"{figure}/{split}"] = value
    scalars["lr"] = lr
    scalars["samples_per_s"] = samples_per_s
    return scalars


class History:
    """What ``fit`` returns, as Keras's ``History``: ``history`` maps each figure (``loss``; ``accuracy``
    or ``mae`` of the training samples when the model's ``metrics`` ask for it, measured at the epoch's
    end with dropout off; ``val_loss``, ``val_accuracy`` or ``val_mae`` with validation data;
    ``seconds``; what callbacks add, such as ``learning_rate``) to its per-epoch list, and ``epoch``
    lists the epochs (0-based, as Keras does)."""

    def __init__(self) -> None:
        self.history: Dict[str, List[float]] = {}
        self.epoch: List[int] = []
        #: Where it trained, e.g. "cuda (NVIDIA H100 80GB HBM3, sm_90, 132 SMs)" or "cpu".
        self.device: str = ""
        #: Seconds of the ``fit`` call: opening the device and handing it the samples
        #: (``setup_seconds``), then the epochs with their validation (``training_seconds``).
        self.seconds: float = 0.0
        self.setup_seconds: float = 0.0
        self.training_seconds: float = 0.0

    def __repr__(self) -> str:
        return f"History(epochs={len(self.epoch)}, keys={list(self.history)})"

    def plot(self, path: Optional[PathLike] = None, show: bool = False) -> Any:
        """Draws the training and validation loss, and the validation accuracy or MAE, per epoch with
        matplotlib (``pip install matplotlib``). Saves the figure to ``path`` when given (the format
        from its extension), shows it when ``show``; returns the matplotlib ``Figure``."""
        try:
            import matplotlib

            if path is not None and not show:
                matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("History.plot needs matplotlib: pip install matplotlib") from e
        epochs = [e + 1 for e in self.epoch]
        metric = next((k for k in ("val_accuracy", "val_mae") if k in self.history), None)
        fig, axes = plt.subplots(1, 2 if metric else 1, figsize=(10 if metric else 5.5, 4), squeeze=False)
        ax = axes[0][0]
        for key, label in (("loss", "training"), ("val_loss", "validation")):
            if key in self.history:
                ax.plot(epochs, self.history[key], marker="o", label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.set_title("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        if metric:
            ax = axes[0][1]
            values = self.history[metric]
            if metric == "val_accuracy":
                values = [100 * v for v in values]
            ax.plot(epochs, values, marker="o", color="tab:green", label="validation")
            ax.set_xlabel("epoch")
            ax.set_ylabel("accuracy (%)" if metric == "val_accuracy" else "mean absolute error")
            ax.set_title("validation accuracy" if metric == "val_accuracy" else "validation MAE")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        if path is not None:
            fig.savefig(os.fspath(path))
        if show:
            plt.show()
        return fig


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class _Progress:
    """What ``fit`` prints. ``verbose=1``: while an epoch trains, a bar on stderr redrawn in place with
    the samples done, the rate, the ETA and the last epoch's loss, drawn only when stderr is a terminal
    (a file or a pipe gets no control characters); the GPU reports an epoch's samples when it ends, so
    there the bar moves at the epoch's end. Then, for ``verbose`` 1 and 2, one Keras-style line per epoch
    on stdout, with the samples and the rate when the bar's count is known; ``style="short"``
    (``NeuralNetworkGPU``'s) prints ``Epoch 3/10 - Loss 0.1234 - Val Acc 97.1%`` instead."""

    WIDTH = 30

    def __init__(self, epochs: int, verbose: int, style: str = "keras", stream: Any = None) -> None:
        self.epochs, self.verbose, self.style = epochs, verbose, style
        self.stream = sys.stderr if stream is None else stream
        self.live = verbose == 1 and _is_terminal(self.stream)
        self.epoch_started = 0.0
        self.done = self.total = 0
        self.last_loss: Optional[float] = None
        self.drawn = 0  # characters of the bar on screen
        self.last_draw = 0.0

    def progress(self, epoch: int, done: int, total: int) -> None:
        now = time.monotonic()
        if done == 0 or done < self.done:
            self.epoch_started = now
        self.done, self.total = done, total
        if not self.live or (now - self.last_draw < 0.1 and 0 < done < total):
            return
        self.last_draw = now
        filled = self.WIDTH * done // max(total, 1)
        arrow = ">" if 0 < filled < self.WIDTH else ""
        parts = [
            f"Epoch {epoch}/{self.epochs} [{'=' * max(filled - len(arrow), 0)}{arrow}"
            f"{'.' * (self.WIDTH - filled)}] {done:,}/{total:,}"
        ]
        elapsed = now - self.epoch_started
        if done and elapsed > 0:
            rate = done / elapsed
            parts.append(f"{rate:,.0f} samples/s")
            parts.append(f"ETA {_duration((total - done) / rate)}" if done < total else _duration(elapsed))
        if self.last_loss is not None:
            parts.append(f"last loss: {self.last_loss:.4f}")
        self._draw(" - ".join(parts))

    def _draw(self, text: str) -> None:
        # Spaces, not an erase sequence, wipe what a longer line left.
        self.stream.write("\r" + text + " " * max(self.drawn - len(text), 0))
        self.stream.flush()
        self.drawn = len(text)

    def epoch(self, epoch: int, logs: Dict[str, float]) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
            self.drawn = 0
        self.last_loss = logs.get("loss")
        counted, self.done = self.done, 0
        if self.verbose == 0:
            return
        if self.style == "short":
            parts = [f"Epoch {epoch}/{self.epochs}", f"Loss {logs['loss']:.4f}"]
            if "val_accuracy" in logs:
                parts.append(f"Val Acc {100 * logs['val_accuracy']:.1f}%")
            print(" - ".join(parts), flush=True)
            return
        seconds = logs.get("seconds", 0.0)
        parts = [f"Epoch {epoch}/{self.epochs}"]
        if counted:
            parts.append(f"{counted:,}/{self.total:,}")
        parts.append(f"{seconds:.2f}s")
        if counted and seconds > 0:
            parts.append(f"{counted / seconds:,.0f} samples/s")
        parts += [f"{key}: {value:.4f}" for key, value in logs.items() if key != "seconds"]
        print(" - ".join(parts), flush=True)


# ------------------------------------------------------------------------------------------------------
# Sequential


def _spec_text(layers: Union[str, Sequence[Union[Layer, str]]]) -> str:
    if isinstance(layers, str):
        return layers
    try:
        parts = [str(layer) for layer in layers]
    except TypeError:
        raise ValueError(
            "layers must be a spec string or a list of layers, e.g. [textnet.Linear(784, 128), textnet.ReLU()]"
        ) from None
    if not parts:
        raise ValueError("layers is empty: give at least one layer")
    return ", ".join(parts)


def _first_width(spec: str) -> Optional[int]:
    """The input width a spec starting with ``Linear(in, out)`` gives, if it does."""
    match = re.match(r"\s*Linear\s*\(\s*(\d+)\s*,\s*\d+", spec, re.IGNORECASE)
    return int(match.group(1)) if match else None


_LOSSES = {
    "ce": "ce",
    "categorical_crossentropy": "ce",
    "sparse_categorical_crossentropy": "ce",
    "mse": "mse",
    "mean_squared_error": "mse",
}
_METRICS = {
    "accuracy": "accuracy",
    "acc": "accuracy",
    "categorical_accuracy": "accuracy",
    "sparse_categorical_accuracy": "accuracy",
    "mae": "mae",
    "mean_absolute_error": "mae",
}
_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


def _choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value.lower()


def _metric_names(metrics: Optional[Sequence[str]], loss: str) -> List[str]:
    """Keras's metric names as the figures ``fit`` logs: "accuracy" for classes, "mae" for values."""
    if metrics is None:
        return []
    if isinstance(metrics, str):
        metrics = [metrics]
    wanted = "accuracy" if loss == "ce" else "mae"
    names = []
    for m in metrics:
        name = _METRICS.get(m.lower() if isinstance(m, str) else m)
        if name is None:
            raise ValueError(f"metrics may hold {', '.join(_METRICS)}; got {m!r}")
        if name != wanted:
            kind = "classes" if loss == "ce" else "values"
            raise ValueError(f"metric {m!r} does not fit loss {loss!r}: a model of {kind} measures {wanted}")
        if name not in names:
            names.append(name)
    return names


def _rate(value: Any) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"a learning rate must be a number, got {value!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"a learning rate must be finite and above 0, got {value!r}")
    return rate


class Sequential:
    """A network of layers, as ``torch.nn.Sequential``:

        model = textnet.Sequential([textnet.Linear(784, 128), textnet.ReLU(), textnet.Linear(128, 10)])
        model = textnet.Sequential("Linear(784, 128), ReLU, Linear(128, 10)")

    ``loss``: ``"ce"`` (softmax cross-entropy against class labels, ``nn.CrossEntropyLoss``) or ``"mse"``
    (mean squared error against values). ``optimizer``: ``"adam"`` (default), ``"adamw"``, ``"sgd"`` or
    ``"momentum"``; ``lr`` its learning rate (default: adam 0.001, sgd 0.1, momentum 0.05); Keras's
    ``compile(optimizer, loss, metrics)`` sets these too. ``metrics=["accuracy"]`` (or ``["mae"]`` for
    ``"mse"``) adds the training samples' figure to each epoch's logs.
    ``device``: ``"auto"`` (a CUDA GPU when one is usable, else the CPU), ``"cuda"`` or ``"cpu"``.
    ``seed`` draws the initial parameters (``init``: ``"pytorch"``, ``"xavier"`` or ``"he"``), the
    shuffles and dropout. The input shape comes from the first ``Linear(in, out)``, from
    ``input_shape``, or from the first data given to ``fit``: (features,) or (channels, height, width).
    ``data_format="channels_last"`` (or a ``Conv2d`` given it) reads images as (height, width, channels),
    as Keras does, in ``input_shape`` and in every array of images given; the model itself stays channels
    first (its summary's shapes, its file).
    """

    def __init__(
        self,
        layers: Union[str, Sequence[Union[Layer, str]]],
        *,
        loss: str = "ce",
        optimizer: str = "adam",
        lr: Optional[float] = None,
        momentum: Optional[float] = None,
        weight_decay: float = 0.0,
        clip_norm: float = 0.0,
        device: str = "auto",
        seed: int = 1,
        init: str = "pytorch",
        input_shape: Optional[Sequence[int]] = None,
        class_names: Optional[Sequence[str]] = None,
        metrics: Optional[Sequence[str]] = None,
        data_format: Optional[str] = None,
    ) -> None:
        self.spec_text = _spec_text(layers)
        _native.parse_spec(self.spec_text)
        for name, value, choices in (
            ("loss", loss, ("ce", "mse")),
            ("optimizer", optimizer, _OPTIMIZERS),
            ("device", device, ("auto", "cuda", "cpu")),
            ("init", init, ("pytorch", "xavier", "he")),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        self.loss, self.optimizer, self.lr, self.momentum = loss, optimizer, lr, momentum
        self.weight_decay, self.clip_norm = weight_decay, clip_norm
        self.device, self.seed, self.init = device, seed, init
        self._class_names = None if class_names is None else [str(c) for c in class_names]
        self._model: Optional[_native.Model] = None
        self.history: Optional[History] = None
        self._keras_state(_metric_names(metrics, loss), self._layers_format(layers, _data_format(data_format)))
        if input_shape is None:
            width = _first_width(self.spec_text)
            input_shape = None if width is None else (width,)
        if input_shape is not None:
            shape = tuple(int(d) for d in input_shape)
            if self.data_format == "channels_last" and len(shape) == 3:
                shape = (shape[2], shape[0], shape[1])
            self._build(shape)

    def _keras_state(self, metrics: List[str], data_format: str) -> None:
        self.metrics, self.data_format = metrics, data_format
        #: Set by a callback to end ``fit`` after the current epoch, as in Keras.
        self.stop_training = False
        self._epoch_lr: Optional[float] = None  # while fit runs: the rate of the epoch
        self._lr_set = False  # while fit runs: whether a callback set that rate
        self._fresh = False  # the parameters are the initial draw (compile may redraw them for another loss)

    @staticmethod
    def _layers_format(layers: Any, given: Optional[str]) -> str:
        """``given``, or the ``data_format`` the ``Conv2d`` layers agree on, or channels first."""
        named = set() if isinstance(layers, str) else {getattr(layer, "data_format", None) for layer in layers}
        named.discard(None)
        if given is not None:
            named.add(given)
        if len(named) > 1:
            raise ValueError("the layers and the model give different data_format values: give one")
        return named.pop() if named else "channels_first"

    @classmethod
    def _of(cls, model: "_native.Model") -> "Sequential":
        seq = cls.__new__(cls)
        seq.spec_text = model.spec
        seq.loss, seq.optimizer, seq.lr, seq.momentum = model.loss, "adam", None, None
        seq.weight_decay, seq.clip_norm, seq.device, seq.seed, seq.init = 0.0, 0.0, "auto", 1, "pytorch"
        seq._class_names = model.class_names
        seq._model = model
        seq.history = None
        seq._keras_state([], "channels_first")
        return seq

    def _build(self, input_shape: Tuple[int, ...]) -> "_native.Model":
        self._model = _native.Model(
            self.spec_text, list(input_shape), self.loss, self.init, self.seed, self._class_names
        )
        self._fresh = True
        return self._model

    def _built(self, what: str) -> "_native.Model":
        if self._model is None:
            raise ValueError(f"{what} needs a trained or built model: call fit first, or give input_shape")
        return self._model

    def compile(
        self,
        optimizer: Optional[str] = None,
        loss: Optional[str] = None,
        metrics: Optional[Sequence[str]] = None,
        learning_rate: Optional[float] = None,
    ) -> None:
        """Keras's ``compile``: the ``optimizer`` (``"adam"``, ``"adamw"``, ``"sgd"``, ``"momentum"``), the
        ``loss`` (``"categorical_crossentropy"``, ``"sparse_categorical_crossentropy"`` or ``"ce"``;
        ``"mean_squared_error"`` or ``"mse"``), the ``metrics`` logged for the training samples
        (``["accuracy"]``, or ``["mae"]`` for values; none when not given, as in Keras) and the
        ``learning_rate``; the optimizer, loss and rate not given stay as they are.
        The loss of a model already trained or loaded stays as it is (``ValueError``); an untrained one is
        drawn again for the new loss, from the same seed."""
        if optimizer is not None:
            self.optimizer = _choice("optimizer", optimizer, _OPTIMIZERS)
        if learning_rate is not None:
            self.lr = _rate(learning_rate)
        new_loss = self.loss if loss is None else _LOSSES.get(loss.lower() if isinstance(loss, str) else loss)
        if new_loss is None:
            raise ValueError(f"loss must be one of {', '.join(_LOSSES)}, got {loss!r}")
        self.metrics = _metric_names(metrics, new_loss)
        if new_loss != self.loss:
            if self._model is not None and not self._fresh:
                raise ValueError(f"this model was trained with loss {self.loss!r}: a new loss needs a new model")
            self.loss = new_loss
            if self._model is not None:
                self._build(self.input_shape or ())

    # -- what the model is

    @property
    def built(self) -> bool:
        """Whether the parameters exist (the input shape is known)."""
        return self._model is not None

    @property
    def spec(self) -> str:
        """The layers as a spec, every width written out once the model is built."""
        return self._model.spec if self._model is not None else self.spec_text

    @property
    def input_shape(self) -> Optional[Tuple[int, ...]]:
        """The shape of one sample, once known (channels first)."""
        return None if self._model is None else tuple(self._model.input_shape)

    @property
    def class_names(self) -> Optional[List[str]]:
        """The name of each class (``"0"``, ``"1"``, … unless given), written to the model file."""
        return self._model.class_names if self._model is not None else self._class_names

    @class_names.setter
    def class_names(self, names: Sequence[str]) -> None:
        self._class_names = [str(n) for n in names]
        if self._model is not None:
            self._model.class_names = self._class_names

    @property
    def learning_rate(self) -> Optional[float]:
        """The learning rate: while ``fit`` runs, the current epoch's (a callback's ``on_epoch_begin`` may
        set it for the epoch's steps and those after); otherwise ``lr`` (None: the optimizer's default)."""
        return self._epoch_lr if self._epoch_lr is not None else self.lr

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        if self._epoch_lr is None:
            self.lr = _rate(value)
        else:
            self._epoch_lr, self._lr_set = _rate(value), True

    def count_params(self) -> int:
        """Number of parameters."""
        return self._built("count_params").param_count

    def __repr__(self) -> str:
        return f"textnet.Sequential({self.spec!r}, loss={self.loss!r})"

    def summary(self, print_fn: Optional[Callable[[str], Any]] = None) -> None:
        """Prints a table of the layers, as Keras does: each layer with the shape of what it gives (a batch
        of ``None`` samples, channels first) and its parameters, then the totals. ``print_fn`` takes each
        line instead of ``print``."""
        model = self._built("summary")
        rows = [("Layer", "Output shape", "Params")]
        for i, (text, shape, params) in enumerate(model.layers):
            rows.append((f"{i}: {text}", str((None, *shape)), f"{params:,}"))
        widths = [max(len(row[c]) for row in rows) for c in range(3)]
        rule = len("   ".join("x" * w for w in widths))

        def line(row: Tuple[str, str, str]) -> str:
            return f"{row[0]:<{widths[0]}}   {row[1]:<{widths[1]}}   {row[2]:>{widths[2]}}"

        total = model.param_count
        out = print if print_fn is None else print_fn
        out('Model: "sequential"')
        out("_" * rule)
        out(line(rows[0]))
        out("=" * rule)
        for row in rows[1:]:
            out(line(row))
        out("=" * rule)
        out(f"Input shape: {(None, *model.input_shape)}")
        out(f"Total params: {total:,} ({4 * total / 1024:,.2f} KB)")
        out(f"Trainable params: {total:,}")
        out("Non-trainable params: 0")
        out("_" * rule)

    # -- training and using it

    def _inputs(self, X: Any, what: str) -> np.ndarray:
        """``X`` as ``_features`` makes it, images moved to channels first for ``"channels_last"``."""
        X = _features(X, what)
        if self.data_format == "channels_last" and X.ndim == 4:
            X = np.ascontiguousarray(X.transpose(0, 3, 1, 2))
        return X

    def _targets(self, y: Any, what: str) -> np.ndarray:
        if self.loss == "ce":
            return _labels(y, what, self._built("fit").outputs)
        return _values(y, self._built("fit").outputs, what)

    def _log_keys(self, validating: bool, callbacks: List[Callback]) -> List[str]:
        """The keys each epoch's logs will hold."""
        metric = "accuracy" if self.loss == "ce" else "mae"
        keys = ["loss", *self.metrics]
        if validating:
            keys += ["val_loss", f"val_{metric}"]
        keys.append("seconds")
        if any(isinstance(c, (LearningRateScheduler, ReduceLROnPlateau)) for c in callbacks):
            keys.append("learning_rate")
        return keys

    def fit(
        self,
        X: Any,
        y: Any,
        epochs: int = 10,
        batch_size: int = 64,
        validation_data: Optional[Tuple[Any, Any]] = None,
        validation_split: Optional[float] = None,
        verbose: int = 1,
        lr: Optional[float] = None,
        lr_schedule: str = "constant",
        warmup: int = 0,
        min_lr: float = 0.0,
        patience: Optional[int] = None,
        callbacks: Optional[Sequence[Callback]] = None,
        tensorboard_dir: Any = None,
    ) -> History:
        """Trains for ``epochs`` passes over ``X``, ``y`` in shuffled batches of ``batch_size``, as Keras's
        ``fit`` does, and returns a ``History``.

        ``X``: samples, shape (n, features) or (n, channels, height, width) ((n, height, width, channels)
        with ``data_format="channels_last"``); float32, or any numeric dtype (converted to float32;
        non-contiguous arrays are copied). ``y``: class labels 0…k−1 of any integer dtype, or one-hot rows
        (n, k), for ``loss="ce"``; values (n,) or (n, outputs) for ``"mse"``. ``validation_data=(X_val,
        y_val)``, or ``validation_split=F`` holding out the last F of the samples (as Keras does), is
        measured after every epoch. ``verbose``: 0 silent, 1 a progress bar per epoch (the samples, their
        rate, the ETA and the last loss; on stderr, and only when it is a terminal) and a line per epoch,
        2 the lines only. Each call starts a fresh optimizer state from the current parameters.

        ``lr_schedule``: the learning rate over the call's steps, as ``textnet fit --lr-schedule`` takes it:
        ``"constant"``, ``"cosine"`` (down to ``min_lr``) or ``"step"`` (×0.1 at 50 % and 75 % of the
        steps), after ``warmup`` steps of linear warm-up. ``patience=N`` stops once the validation loss has
        not improved for N epochs (it needs validation data). ``callbacks``: ``textnet.callbacks`` objects
        (``EarlyStopping``, ``ModelCheckpoint``, ``LearningRateScheduler``, ``CSVLogger``, one's own
        ``Callback``), called at the start and end of training and of each epoch; while they run the model
        holds the epoch's parameters, and training waits for them. A callback's per-batch hooks
        (``on_train_batch_begin``/``end``) are called around every batch on the CPU; on a GPU, which runs an
        epoch as one captured graph, they raise ``NotImplementedError``.

        ``tensorboard_dir``: write a TensorBoard event file there (created if missing; ``OSError`` before
        training when it cannot be), as ``textnet fit --tensorboard`` does: per epoch (steps counted from
        1) ``loss/train``, ``accuracy/train`` or ``mae/train`` when measured, ``loss/val`` and the other
        ``val_`` figures as ``…/val``, ``lr`` and ``samples_per_s``; at the end the call's settings as
        hyperparameters. Watch it with ``tensorboard --logdir DIR``.

        Ctrl-C stops after the current epoch: the model keeps it, ``self.history`` holds the epochs done,
        and ``KeyboardInterrupt`` is raised. A run whose loss or parameters stop being finite keeps the
        last finite epoch and raises ``RuntimeError``. Bad data raises ``ValueError``, a GPU failure
        ``RuntimeError``, a network or batch too large for the memory left ``MemoryError``, and a second
        ``fit`` while another thread trains the model ``RuntimeError``. An exception in a callback ends
        training before the next epoch and is raised.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if verbose not in (0, 1, 2):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        callbacks = list(callbacks or [])
        for c in callbacks:
            if not isinstance(c, Callback):
                raise ValueError(f"callbacks must be textnet.callbacks.Callback objects, got {c!r}")
        for setter in (LearningRateScheduler, ReduceLROnPlateau):
            if any(isinstance(c, setter) for c in callbacks) and (lr_schedule != "constant" or warmup):
                raise ValueError(
                    f"a {setter.__name__} sets the epochs' rate: give it or lr_schedule/warmup, not both"
                )
        X = self._inputs(X, "X")
        if self._model is None:
            shape = X.shape[1:]
            try:
                self._build(shape if len(shape) in (1, 3) else (int(np.prod(shape)),))
            except ValueError as e:
                if X.ndim == 4 and "channels" in str(e) and self.data_format == "channels_first":
                    raise ValueError(
                        f"{e}; textnet reads images as (n, channels, height, width): for (n, height, width, "
                        f'channels) give data_format="channels_last"'
                    ) from None
                raise
        y = self._targets(y, "y")
        X_val = y_val = None
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise ValueError("validation_data must be a pair (X_val, y_val)")
            X_val = self._inputs(validation_data[0], "X_val")
            y_val = self._targets(validation_data[1], "y_val")
        board = None if tensorboard_dir is None else SummaryWriter(tensorboard_dir)
        board_tags: List[str] = []
        result: Optional[Dict[str, Any]] = None
        progress = _Progress(int(epochs), verbose, getattr(self, "_progress_style", "keras"))
        history = History()
        keys = self._log_keys(validation_data is not None or validation_split is not None, callbacks)
        for c in callbacks:
            c.set_model(self)
            c.set_params({"epochs": int(epochs), "verbose": verbose, "metrics": keys})
        last_logs: Dict[str, float] = {}

        def on_epoch_begin(epoch: int, planned: float) -> Optional[float]:
            if not self._lr_set:
                self._epoch_lr = planned
            for c in callbacks:
                c.on_epoch_begin(epoch - 1, {})
            return self._epoch_lr if self._lr_set else None

        def on_epoch(epoch: int, logs: Dict[str, float], samples_per_s: float, epoch_lr: float) -> bool:
            nonlocal last_logs
            if board is not None:
                scalars = _board_scalars(logs, samples_per_s, epoch_lr)
                board.add_scalars(scalars, epoch)
                board_tags.extend(tag for tag in scalars if tag not in board_tags)
            history.epoch.append(epoch - 1)
            progress.epoch(epoch, logs)
            for c in callbacks:
                c.on_epoch_end(epoch - 1, logs)
            for key, value in logs.items():
                history.history.setdefault(key, []).append(value)
            last_logs = logs
            return self.stop_training

        batch_callbacks = [c for c in callbacks if wants_batches(c)]

        def on_step(epoch: int, done: int, total: int, loss_sum: float) -> None:
            if done > 0:
                batch = -(-done // int(batch_size)) - 1
                logs = {"loss": loss_sum / done}
                for c in batch_callbacks:
                    c.on_train_batch_end(batch, logs)
            if done < total:
                batch = -(-done // int(batch_size))
                for c in batch_callbacks:
                    c.on_train_batch_begin(batch, {})

        self.stop_training, self._lr_set = False, False
        self._epoch_lr = None
        for c in callbacks:
            c.on_train_begin({})
        try:
            result = self._built("fit").fit(
                X,
                y,
                X_val,
                y_val,
                validation_split,
                epochs=int(epochs),
                batch_size=int(batch_size),
                optimizer=self.optimizer,
                lr=self.lr if lr is None else lr,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
                clip_norm=self.clip_norm,
                device=self.device,
                seed=self.seed,
                lr_schedule=lr_schedule,
                warmup=warmup,
                min_lr=min_lr,
                patience=patience,
                train_metric=bool(self.metrics),
                epoch_params=bool(callbacks),
                on_progress=progress.progress if verbose == 1 else None,
                on_epoch_begin=on_epoch_begin if callbacks else None,
                on_epoch=on_epoch,
                on_step=on_step if batch_callbacks else None,
            )
        finally:
            self._epoch_lr = None
            if board is not None:
                settings = {
                    "epochs": int(epochs), "batch_size": int(batch_size), "optimizer": self.optimizer,
                    "lr": self.lr if lr is None else lr, "momentum": self.momentum,
                    "weight_decay": self.weight_decay, "clip_norm": self.clip_norm, "seed": self.seed,
                    "lr_schedule": lr_schedule, "warmup": warmup, "min_lr": min_lr, "patience": patience,
                    "layers": self._built("fit").spec, "loss": self.loss, "device": self.device,
                }
                ended = result is not None and not (result["diverged"] or result["interrupted"])
                try:
                    board._hparams(settings, board_tags, ended)
                finally:
                    board.close()
        self._fresh = False
        self.history = history
        history.device, history.seconds = result["device"], result["seconds"]
        history.setup_seconds, history.training_seconds = result["setup_seconds"], result["training_seconds"]
        for c in callbacks:
            c.on_train_end(last_logs)
        if result["diverged"]:
            raise RuntimeError(result["diverged"])
        if result["interrupted"]:
            raise KeyboardInterrupt(f"stopped after epoch {len(history.epoch)} of {epochs}; the model keeps it")
        return history

    def evaluate(self, X: Any, y: Any, batch_size: int = 1024, verbose: int = 0,
                 return_dict: bool = False) -> Union[float, List[float], Dict[str, float]]:
        """The mean loss on ``X``, ``y`` and the compiled metrics (``metrics=["accuracy"]`` for classes,
        ``["mae"]`` for values), dropout off, as Keras returns them: the loss alone (a float) when no
        metric was compiled, else a list ``[loss, metric, …]``; with ``return_dict`` a dict ``{"loss": …,
        "accuracy": …}``."""
        measured = self._measured(X, y, batch_size)
        logs = {key: measured[key] for key in ["loss", *self.metrics]}
        if verbose:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        if return_dict:
            return logs
        return logs["loss"] if len(logs) == 1 else list(logs.values())

    def _measured(self, X: Any, y: Any, batch_size: int) -> Dict[str, float]:
        """The loss and both figures (accuracy or mae) on ``X``, ``y``, compiled or not."""
        X = self._inputs(X, "X")
        model = self._built("evaluate")
        return model.evaluate(X, self._targets(y, "y"), device=self.device, batch=int(batch_size))

    def predict(self, X: Any, batch_size: int = 1024) -> np.ndarray:
        """The network's outputs for ``X``, shape (n, outputs): class probabilities (softmax) for ``"ce"``,
        values for ``"mse"``; dropout off."""
        X = self._inputs(X, "X")
        model = self._built("predict")
        out = model.forward(X, device=self.device, batch=int(batch_size))
        if model.loss == "ce":
            out = out - out.max(axis=1, keepdims=True)
            np.exp(out, out=out)
            out /= out.sum(axis=1, keepdims=True)
        else:
            mean, std = model.target_scale
            out = out * std + mean
        return out

    def predict_classes(self, X: Any, batch_size: int = 1024) -> np.ndarray:
        """The likeliest class of each sample, int64 (``"ce"`` models)."""
        if self.loss != "ce":
            raise ValueError("predict_classes needs a model of classes (loss \"ce\"); use predict")
        X = self._inputs(X, "X")
        logits = self._built("predict_classes").forward(X, device=self.device, batch=int(batch_size))
        return np.argmax(logits, axis=1).astype(np.int64)

    # -- files and PyTorch

    def save(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the model as a ``textnet fit`` model file (safetensors under ``nn.Sequential``'s
        ``state_dict`` names), atomically, as ``textnet fit --out`` does: a file there that is not a textnet
        model is refused (``FileExistsError``) unless ``overwrite``; a textnet model of another kind is
        never replaced (``FileExistsError``), nor a directory, FIFO or device, nor a file that a
        ``textnet`` run is writing (``ValueError``). ``textnet classify`` reads a model of 784 or 1×28×28
        inputs as 28×28 images scaled as ``textnet.datasets.mnist`` gives them."""
        self._built("save").save(os.fspath(path), overwrite)

    def export_onnx(self, path: PathLike) -> None:
        """Writes the model as an ONNX file (operator set 17), as ``textnet export --onnx`` does with its
        saved file: input ``input`` (float32, ``[batch, *input_shape]``), outputs ``logits`` and
        ``probabilities`` (``"ce"``) or ``values`` (``"mse"``, in the target's units), as ``predict`` gives
        them; dropout is left out, as in evaluation. A model file already at ``path`` is never replaced
        (``ValueError``). See docs/onnx.md."""
        self._built("export_onnx").export_onnx(os.fspath(path))

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Every parameter tensor as a float32 array, under PyTorch's ``nn.Sequential`` names
        (``0.weight``, ``0.bias``, …), so ``torch_model.load_state_dict`` takes them."""
        return OrderedDict(self._built("state_dict").state_dict())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Replaces the named tensors (arrays or torch tensors of the same shapes)."""
        tensors = []
        for name, value in state.items():
            if hasattr(value, "detach"):
                value = value.detach().cpu().numpy()
            tensors.append((str(name), np.ascontiguousarray(value, dtype=np.float32)))
        self._built("load_state_dict").load_state_dict(tensors)
        self._fresh = False

    def to_torch(self) -> Any:
        """The network as a ``torch.nn.Sequential`` holding these weights (needs ``torch``). GELU is
        ``nn.GELU(approximate="tanh")``, as textnet computes it; its outputs are logits (``"ce"``)."""
        try:
            import torch
            from torch import nn
        except ImportError as e:
            raise ImportError("to_torch needs PyTorch: pip install torch") from e
        modules = [_torch_layer(nn, text) for text in _split_spec(self._built("to_torch").spec)]
        seq = nn.Sequential(*modules)
        seq.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in self.state_dict().items()}, strict=True)
        seq.eval()
        return seq


def _split_spec(spec: str) -> List[str]:
    """The layers of a spec with every width written out (``Model.spec``), one text each."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i].strip())
            start = i + 1
    parts.append(spec[start:].strip())
    return parts


def _torch_layer(nn: Any, text: str) -> Any:
    name, _, rest = text.partition("(")
    args = [a.strip() for a in rest.rstrip(")").split(",") if a.strip()]
    positional = [a for a in args if "=" not in a]
    named = dict(a.split("=", 1) for a in args if "=" in a)
    if name == "Linear":
        return nn.Linear(int(positional[0]), int(positional[1]), bias=named.get("bias", "true") != "false")
    if name == "Conv2d":
        return nn.Conv2d(
            int(positional[0]),
            int(positional[1]),
            int(positional[2]),
            stride=int(named.get("stride", 1)),
            padding=int(named.get("padding", 0)),
        )
    if name == "MaxPool2d":
        return nn.MaxPool2d(int(positional[0]))
    if name == "Dropout":
        return nn.Dropout(float(positional[0]))
    if name == "GELU":
        return nn.GELU(approximate="tanh")
    return {"ReLU": nn.ReLU, "Sigmoid": nn.Sigmoid, "Tanh": nn.Tanh, "Flatten": nn.Flatten}[name]()


def load(path: PathLike) -> Sequential:
    """Reads a ``textnet fit`` model file, written by ``Sequential.save`` or by the command line
    (``textnet fit``): a model of images, arrays or a table. Raises ``FileNotFoundError`` or
    ``ValueError`` (not a fit model file, or a damaged one)."""
    return Sequential._of(_native.Model.load(os.fspath(path)))


# ------------------------------------------------------------------------------------------------------
# NeuralNetworkGPU: a fixed two-layer network


class NeuralNetworkGPU:
    """A two-layer network, ``input_size → hidden_size → ReLU → output_size``, trained with
    softmax cross-entropy on the GPU (the CPU when none is usable, or with ``device="cpu"``):

        nn = NeuralNetworkGPU(784, 128, 10)
        nn.fit(X_train, y_train, epochs=10)   # "Epoch 10/10 - Loss 0.0412 - Val Acc 97.8%"
        accuracy = nn.evaluate(X_test, y_test)

    A thin layer over ``Sequential`` (``self.model``), with Adam at ``learning_rate``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        batch_size: int = 32,
        device: str = "auto",
        seed: int = 1,
    ) -> None:
        self.batch_size = batch_size
        self.model = Sequential(
            [Linear(input_size, hidden_size), ReLU(), Linear(hidden_size, output_size)], device=device, seed=seed
        )
        self.model._progress_style = "short"

    def fit(
        self,
        X: Any,
        y: Any,
        epochs: int = 10,
        learning_rate: float = 0.001,
        validation_data: Optional[Tuple[Any, Any]] = None,
        verbose: int = 1,
    ) -> History:
        """Trains ``epochs`` passes in batches of ``batch_size``; without ``validation_data`` the last 10 %
        of the samples validate. Prints one line per epoch (``verbose=0``: none)."""
        split = None if validation_data is not None else 0.1
        return self.model.fit(
            X,
            y,
            epochs=epochs,
            batch_size=self.batch_size,
            validation_data=validation_data,
            validation_split=split,
            verbose=verbose,
            lr=learning_rate,
        )

    def evaluate(self, X: Any, y: Any) -> float:
        """The accuracy on ``X``, ``y`` as a fraction."""
        return self.model._measured(X, y, 1024)["accuracy"]

    def predict(self, X: Any) -> np.ndarray:
        """The likeliest class of each sample."""
        return self.model.predict_classes(X)

    def save(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the model file (``Sequential.save``)."""
        self.model.save(path, overwrite)
