"""Datasets as NumPy arrays."""

import os
from typing import Optional, Tuple

import numpy as np

from . import _native

__all__ = ["mnist", "class_names"]


def mnist(
    kind: str = "digits", path: "Optional[str | os.PathLike]" = None
) -> Tuple[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]:
    """MNIST (``kind="digits"``) or Fashion-MNIST (``kind="fashion"``) as
    ``(X_train, y_train), (X_test, y_test)``.

    X is float32 of shape (n, 784), each 28×28 image row by row with its pixels divided by 255 (as the
    command line trains on them); y is int64 class labels 0–9. The four IDX files are read from ``path``
    or, without it, found where ``textnet mnist`` looks (``TEXTNET_DATA``, ``./data``, the cache,
    Debian's ``/usr/share/datasets``), else downloaded into the cache and checked. Raises
    ``FileNotFoundError`` or ``ValueError`` with what is missing."""
    if path is not None and not os.path.exists(path):
        raise FileNotFoundError(f"no such directory: {os.fspath(path)}")
    return _native.mnist(kind, None if path is None else os.fspath(path))


def class_names(kind: str = "digits") -> "list[str]":
    """The names of the 10 classes of ``mnist(kind)``, e.g. ``"T-shirt/top"`` for Fashion-MNIST's 0."""
    return _native.mnist_class_names(kind)
