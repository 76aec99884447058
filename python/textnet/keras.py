"""``textnet.keras``: networks written as layers (``Sequential``), trained with ``fit`` on NumPy arrays, in
the style of Keras, and the roadmap's ``NeuralNetworkGPU``; the package's top level (``textnet.Sequential``,
``textnet.Linear``, …) holds these. ``textnet.nn`` is PyTorch's style instead: modules the user writes,
on tensors with autograd.

A ``Sequential`` is a ``textnet fit`` network: the same layers, the same CPU reference and fused GPU
kernels, the same initial parameters, shuffles and model files. Training the same spec on the same
samples with the same seed in Python and with ``textnet fit`` gives the same parameters.
"""

import os
import re
import sys
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native

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


class Conv2d(Layer):
    """2-D convolution (``nn.Conv2d``); samples are (channels, height, width)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0
    ) -> None:
        super().__init__(
            f"Conv2d({_int(in_channels, 'in_channels')}, {_int(out_channels, 'out_channels')}, "
            f"{_int(kernel_size, 'kernel_size')}, stride={_int(stride, 'stride')}, "
            f"padding={_int(padding, 'padding')})"
        )


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


def _labels(y: Any, what: str = "y") -> np.ndarray:
    """Class labels as int64: integer dtypes of any width, or floats holding whole numbers."""
    array = np.asarray(y)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
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


class History:
    """What ``fit`` returns, as Keras's ``History``: ``history`` maps each figure (``loss``,
    ``val_loss``, ``val_accuracy`` or ``val_mae``, ``seconds``) to its per-epoch list, and ``epoch``
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


class _Progress:
    """A bar per epoch (tqdm when it is installed, else one line rewritten in place), then one
    Keras-style line per epoch."""

    def __init__(self, epochs: int, verbose: int, style: str = "keras") -> None:
        self.epochs, self.verbose, self.style = epochs, verbose, style
        self.bar: Any = None
        self.last_draw = 0.0
        try:
            from tqdm.auto import tqdm

            self.tqdm: Any = tqdm
        except ImportError:
            self.tqdm = None

    def progress(self, epoch: int, done: int, total: int) -> None:
        if self.verbose != 1:
            return
        if self.tqdm is not None:
            if self.bar is None:
                self.bar = self.tqdm(total=total, desc=f"Epoch {epoch}/{self.epochs}", unit="sample", leave=False)
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last_draw < 0.1 and done < total:
            return
        self.last_draw = now
        width = 30
        filled = width * done // max(total, 1)
        sys.stdout.write(f"\rEpoch {epoch}/{self.epochs} [{'=' * filled}{'.' * (width - filled)}] {done}/{total}")
        sys.stdout.flush()
        self.bar = True

    def epoch(self, epoch: int, logs: Dict[str, float]) -> None:
        if self.bar is not None and self.bar is not True:
            self.bar.close()
        elif self.bar is True:
            sys.stdout.write("\r\033[K")
        self.bar = None
        if self.verbose == 0:
            return
        if self.style == "roadmap":
            parts = [f"Epoch {epoch}/{self.epochs}", f"Loss {logs['loss']:.4f}"]
            if "val_accuracy" in logs:
                parts.append(f"Val Acc {100 * logs['val_accuracy']:.1f}%")
            print(" - ".join(parts), flush=True)
            return
        parts = [f"Epoch {epoch}/{self.epochs}", f"{logs.get('seconds', 0):.2f}s", f"loss: {logs['loss']:.4f}"]
        for key in ("val_loss", "val_accuracy", "val_mae"):
            if key in logs:
                parts.append(f"{key}: {logs[key]:.4f}")
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


class Sequential:
    """A network of layers, as ``torch.nn.Sequential``:

        model = textnet.Sequential([textnet.Linear(784, 128), textnet.ReLU(), textnet.Linear(128, 10)])
        model = textnet.Sequential("Linear(784, 128), ReLU, Linear(128, 10)")

    ``loss``: ``"ce"`` (softmax cross-entropy against class labels, ``nn.CrossEntropyLoss``) or ``"mse"``
    (mean squared error against values). ``optimizer``: ``"adam"`` (default), ``"adamw"``, ``"sgd"`` or
    ``"momentum"``; ``lr`` its learning rate (default: adam 0.001, sgd 0.1, momentum 0.05).
    ``device``: ``"auto"`` (a CUDA GPU when one is usable, else the CPU), ``"cuda"`` or ``"cpu"``.
    ``seed`` draws the initial parameters (``init``: ``"pytorch"``, ``"xavier"`` or ``"he"``), the
    shuffles and dropout. The input shape comes from the first ``Linear(in, out)``, from
    ``input_shape``, or from the first data given to ``fit``: (features,) or (channels, height, width).
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
    ) -> None:
        self.spec_text = _spec_text(layers)
        _native.parse_spec(self.spec_text)
        for name, value, choices in (
            ("loss", loss, ("ce", "mse")),
            ("optimizer", optimizer, ("sgd", "momentum", "adam", "adamw")),
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
        if input_shape is None:
            width = _first_width(self.spec_text)
            input_shape = None if width is None else (width,)
        if input_shape is not None:
            self._build(tuple(int(d) for d in input_shape))

    @classmethod
    def _of(cls, model: "_native.Model") -> "Sequential":
        seq = cls.__new__(cls)
        seq.spec_text = model.spec
        seq.loss, seq.optimizer, seq.lr, seq.momentum = model.loss, "adam", None, None
        seq.weight_decay, seq.clip_norm, seq.device, seq.seed, seq.init = 0.0, 0.0, "auto", 1, "pytorch"
        seq._class_names = model.class_names
        seq._model = model
        seq.history = None
        return seq

    def _build(self, input_shape: Tuple[int, ...]) -> "_native.Model":
        self._model = _native.Model(
            self.spec_text, list(input_shape), self.loss, self.init, self.seed, self._class_names
        )
        return self._model

    def _built(self, what: str) -> "_native.Model":
        if self._model is None:
            raise ValueError(f"{what} needs a trained or built model: call fit first, or give input_shape")
        return self._model

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
        """The shape of one sample, once known."""
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

    def count_params(self) -> int:
        """Number of parameters."""
        return self._built("count_params").param_count

    def __repr__(self) -> str:
        return f"textnet.Sequential({self.spec!r}, loss={self.loss!r})"

    def summary(self) -> str:
        """One line: the layers, the parameter count and the input shape."""
        if self._model is None:
            return f"Sequential({self.spec_text}); not built yet"
        return f"Sequential({self.spec}); {self.count_params():,} parameters; input {self.input_shape}"

    # -- training and using it

    def _targets(self, y: Any, what: str) -> np.ndarray:
        if self.loss == "ce":
            return _labels(y, what)
        return _values(y, self._built("fit").outputs, what)

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
    ) -> History:
        """Trains for ``epochs`` passes over ``X``, ``y`` in shuffled batches of ``batch_size``, as Keras's
        ``fit`` does, and returns a ``History``.

        ``X``: samples, shape (n, features) or (n, channels, height, width); float32, or any numeric dtype
        (converted to float32; non-contiguous arrays are copied). ``y``: class labels 0…k−1 of any integer
        dtype for ``loss="ce"``, values (n,) or (n, outputs) for ``"mse"``. ``validation_data=(X_val,
        y_val)``, or ``validation_split=F`` holding out the last F of the samples (as Keras does), is
        measured after every epoch. ``verbose``: 0 silent, 1 a progress bar per epoch (tqdm when installed)
        and a line per epoch, 2 the lines only. Each call starts a fresh optimizer state from the current
        parameters.

        ``lr_schedule``: the learning rate over the call's steps, as ``textnet fit --lr-schedule`` takes it:
        ``"constant"``, ``"cosine"`` (down to ``min_lr``) or ``"step"`` (×0.1 at 50 % and 75 % of the
        steps), after ``warmup`` steps of linear warm-up. ``patience=N`` stops once the validation loss has
        not improved for N epochs (it needs validation data).

        Ctrl-C stops after the current epoch: the model keeps it, ``self.history`` holds the epochs done,
        and ``KeyboardInterrupt`` is raised. A run whose loss or parameters stop being finite keeps the
        last finite epoch and raises ``RuntimeError``. Bad data raises ``ValueError``, a GPU failure
        ``RuntimeError``, a network or batch too large for the memory left ``MemoryError``, and a second
        ``fit`` while another thread trains the model ``RuntimeError``.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if verbose not in (0, 1, 2):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        X = _features(X, "X")
        if self._model is None:
            shape = X.shape[1:]
            self._build(shape if len(shape) in (1, 3) else (int(np.prod(shape)),))
        y = self._targets(y, "y")
        X_val = y_val = None
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise ValueError("validation_data must be a pair (X_val, y_val)")
            X_val = _features(validation_data[0], "X_val")
            y_val = self._targets(validation_data[1], "y_val")
        progress = _Progress(int(epochs), verbose, getattr(self, "_progress_style", "keras"))
        history = History()

        def on_epoch(epoch: int, logs: Dict[str, float]) -> None:
            history.epoch.append(epoch - 1)
            for key, value in logs.items():
                history.history.setdefault(key, []).append(value)
            progress.epoch(epoch, logs)

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
            on_progress=progress.progress if verbose == 1 else None,
            on_epoch=on_epoch,
        )
        self.history = history
        history.device, history.seconds = result["device"], result["seconds"]
        history.setup_seconds, history.training_seconds = result["setup_seconds"], result["training_seconds"]
        if result["diverged"]:
            raise RuntimeError(result["diverged"])
        if result["interrupted"]:
            raise KeyboardInterrupt(f"stopped after epoch {len(history.epoch)} of {epochs}; the model keeps it")
        return history

    def evaluate(self, X: Any, y: Any, batch_size: int = 1024, verbose: int = 0) -> Dict[str, float]:
        """The mean loss on ``X``, ``y`` and the accuracy (``"ce"``) or mean absolute error (``"mse"``), as
        a dict ``{"loss": …, "accuracy": …}`` or ``{"loss": …, "mae": …}``; dropout off."""
        X = _features(X, "X")
        model = self._built("evaluate")
        logs = model.evaluate(X, self._targets(y, "y"), device=self.device, batch=int(batch_size))
        if verbose:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        return logs

    def predict(self, X: Any, batch_size: int = 1024) -> np.ndarray:
        """The network's outputs for ``X``, shape (n, outputs): class probabilities (softmax) for ``"ce"``,
        values for ``"mse"``; dropout off."""
        X = _features(X, "X")
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
        X = _features(X, "X")
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
# The roadmap's class


class NeuralNetworkGPU:
    """The roadmap's two-layer network, ``input_size → hidden_size → ReLU → output_size``, trained with
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
        self.model._progress_style = "roadmap"

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
        return self.model.evaluate(X, y)["accuracy"]

    def predict(self, X: Any) -> np.ndarray:
        """The likeliest class of each sample."""
        return self.model.predict_classes(X)

    def save(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the model file (``Sequential.save``)."""
        self.model.save(path, overwrite)
