"""Tensors with autograd, as ``torch``'s: ``textnet.tensor``, ``zeros``, ``ones``, ``randn``, ``arange``,
``cat``, ``no_grad`` and ``manual_seed``. A ``Tensor`` (``textnet._native.Tensor``) holds float32 or
float64 elements on the CPU (``device="cpu"``) or float32 on the GPU (``"cuda"``), or int64 class ids
(what ``embedding`` and ``cross_entropy`` read); its methods are ``textnet.nn``'s ops.
"""

import functools
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import numpy as np

from . import _native

Tensor = _native.Tensor

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
long = int64
double = float64

_DTYPES = {"float32": float32, "float64": float64, "int64": int64}

Shape = Union[int, Sequence[int]]


def _dtype(dtype: Any) -> Optional[np.dtype]:
    if dtype is None:
        return None
    wanted = np.dtype(dtype)
    if wanted.name not in _DTYPES:
        raise ValueError(f"dtype must be float32, float64 or int64, got {wanted.name}")
    return wanted


def tensor(data: Any, dtype: Any = None, device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of ``data`` (a NumPy array, a nested list of numbers, a number or a tensor), copied, as
    ``torch.tensor``: a NumPy array keeps its dtype, Python floats become float32 and Python ints int64
    (other dtypes convert: floats to float32, integers and booleans to int64)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    from_numpy = isinstance(data, (np.ndarray, np.generic))
    array = np.asarray(data)
    wanted = _dtype(dtype)
    if wanted is None:
        if array.dtype.kind in "biu":
            wanted = int64
        elif from_numpy and array.dtype == float64:
            wanted = float64
        elif array.dtype.kind == "f":
            wanted = float32
        else:
            raise ValueError(f"tensor: data of dtype {array.dtype} is not numbers")
    return Tensor(np.ascontiguousarray(array, dtype=wanted), requires_grad=requires_grad, device=device)


def _shape(size: Sequence[Any]) -> "tuple[int, ...]":
    if len(size) == 1 and not isinstance(size[0], int):
        return tuple(size[0])
    return tuple(size)


def full(size: Shape, fill_value: float, dtype: Any = None, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (float32 unless ``dtype`` says otherwise)."""
    shape = (size,) if isinstance(size, int) else tuple(size)
    array = np.full(shape, fill_value, dtype=_dtype(dtype) or float32)
    return Tensor(array, requires_grad=requires_grad, device=device)


def zeros(*size: Any, dtype: Any = None, device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of zeros: ``zeros(2, 3)`` or ``zeros((2, 3))``."""
    return full(_shape(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)


def ones(*size: Any, dtype: Any = None, device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of ones: ``ones(2, 3)`` or ``ones((2, 3))``."""
    return full(_shape(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)


def randn(*size: Any, dtype: Any = None, device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of draws of N(0, 1) from the generator ``manual_seed`` seeds (drawn in float32)."""
    shape = _shape(size)
    draws = _native.normal_draws(int(np.prod(shape, dtype=np.int64)))
    array = draws.reshape(shape).astype(_dtype(dtype) or float32)
    return Tensor(array, requires_grad=requires_grad, device=device)


def arange(start: float, end: Optional[float] = None, step: float = 1, dtype: Any = None,
           device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """``start, start + step, …`` below ``end`` (``arange(n)``: ``0 … n−1``), int64 when every argument is a
    whole number, else float32, as ``torch.arange``."""
    if end is None:
        start, end = 0, start
    array = np.arange(start, end, step)
    return tensor(array if dtype is not None or array.dtype.kind != "f" else array.astype(float32),
                  dtype=dtype, device=device, requires_grad=requires_grad)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``tensors`` joined along ``dim``."""
    return _native.cat(list(tensors), dim)


def manual_seed(seed: int) -> None:
    """Seeds the generator of ``randn``, the layers' initial parameters and dropout's masks."""
    _native.manual_seed(seed)


def is_grad_enabled() -> bool:
    """Whether ops on this thread record their graph (False inside ``no_grad``)."""
    return _native.is_grad_enabled()


_Function = TypeVar("_Function", bound=Callable[..., Any])


class no_grad:  # noqa: N801 (torch's name)
    """Within ``with textnet.no_grad():`` (or in a function decorated with ``@textnet.no_grad()``), ops
    record no graph: their results need no gradient and keep nothing for a backward."""

    def __init__(self) -> None:
        self._guard = _native.NoGrad()

    def __enter__(self) -> None:
        self._guard.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return self._guard.__exit__(*exc)

    def __call__(self, function: _Function) -> _Function:
        @functools.wraps(function)
        def without_grad(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return function(*args, **kwargs)

        return without_grad  # type: ignore[return-value]
