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


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``tensors``, of one shape, joined along a new axis ``dim``."""
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor of ``array``'s elements (copied, unlike ``torch.from_numpy``, which shares them)."""
    return tensor(array)


# ------------------------------------------------------------------------------------------------------
# Methods computed on the host with NumPy, outside the graph (their results need no gradient), but for
# masked_fill, made of the graph's products and sums. textnet has no bool dtype: comparisons give int64
# 0/1 tensors, which masked_fill takes as masks.


def _like(tensor_: Tensor, array: np.ndarray) -> Tensor:
    """A tensor of ``array`` on ``tensor_``'s device."""
    return Tensor(np.ascontiguousarray(array), device=tensor_.device)


def _masked_fill(self: Tensor, mask: Any, value: float) -> Tensor:
    """The tensor with ``value`` where ``mask`` (nonzero elements; broadcast to the tensor's shape) is
    set, as ``torch.Tensor.masked_fill``; its gradient flows to the elements kept."""
    flags = (mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)) != 0
    try:
        np.broadcast_to(flags, tuple(self.shape))
    except ValueError:
        raise ValueError(
            f"masked_fill: the mask's shape {list(flags.shape)} does not broadcast to the tensor's {list(self.shape)}"
        ) from None
    if self.dtype == int64:
        return _like(self, np.where(flags, value, self.numpy()).astype(np.int64))
    keep = _like(self, np.where(flags, 0, 1).astype(self.dtype))
    fill = _like(self, np.where(flags, value, 0).astype(self.dtype))
    # x·1 + 0 is x and x·0 + value is value, exactly (for finite x).
    return self * keep + fill


def _comparison(compare: Callable[[np.ndarray, Any], np.ndarray]) -> Callable[[Tensor, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        if isinstance(other, Tensor):
            other = other.numpy()
        elif not isinstance(other, (int, float, np.ndarray, np.generic)):
            return NotImplemented
        return _like(self, compare(self.numpy(), other).astype(np.int64))

    method.__doc__ = "An int64 tensor of 1 where the comparison holds, else 0 (NumPy's broadcasting)."
    return method


def _axis(op: str, tensor_: Tensor, dim: int) -> int:
    rank = len(tensor_.shape)
    if not -rank <= dim < rank:
        raise IndexError(f"{op}: shape {list(tensor_.shape)} has no axis {dim}")
    return dim % rank


def _topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> "tuple[Tensor, Tensor]":
    """The ``k`` largest (smallest unless ``largest``) elements along ``dim`` and their int64 indices,
    largest first, as ``torch.topk``; the values are outside the graph."""
    axis = _axis("topk", self, dim)
    values = np.moveaxis(self.numpy(), axis, -1)
    if not 0 <= k <= values.shape[-1]:
        raise ValueError(f"topk: k={k} is not in 0..{values.shape[-1]} (axis {dim} of shape {list(self.shape)})")
    order = np.argsort(-values if largest else values, axis=-1, kind="stable")[..., :k]
    top = np.take_along_axis(values, order, axis=-1)
    return _like(self, np.moveaxis(top, -1, axis)), _like(self, np.moveaxis(order, -1, axis).astype(np.int64))


def _multinomial(self: Tensor, num_samples: int, replacement: bool = False) -> Tensor:
    """``num_samples`` int64 indices per row of weights (``[C]`` or ``[N, C]``, non-negative, not
    necessarily summing to 1), drawn with the generator ``textnet.manual_seed`` seeds; without
    ``replacement`` no index comes twice in a row's draws."""
    weights = np.asarray(self.numpy(), dtype=np.float64)
    if weights.ndim not in (1, 2):
        raise ValueError(f"multinomial: the weights must be [C] or [N, C], got shape {list(weights.shape)}")
    rows = weights.reshape(-1, weights.shape[-1])
    if not np.all(np.isfinite(rows)) or np.any(rows < 0) or np.any(rows.sum(axis=1) <= 0):
        raise ValueError("multinomial: every row of weights must be finite, non-negative and not all zero")
    if not replacement and num_samples > int(np.count_nonzero(rows, axis=1).min()):
        raise ValueError(f"multinomial: {num_samples} samples without replacement from a row of fewer nonzero weights")
    draws = _native.uniform_draws(rows.shape[0] * num_samples).reshape(rows.shape[0], num_samples)
    picked = np.empty((rows.shape[0], num_samples), dtype=np.int64)
    for r, row in enumerate(rows):
        left = row.copy()
        for s in range(num_samples):
            cumulative = np.cumsum(left)
            index = int(np.searchsorted(cumulative, draws[r, s] * cumulative[-1], side="right"))
            picked[r, s] = min(index, len(left) - 1)
            if not replacement:
                left[picked[r, s]] = 0
    return _like(self, picked.reshape(weights.shape[:-1] + (num_samples,)))


def _argmax(self: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """The int64 index of the largest element (of the flattened tensor when ``dim`` is None)."""
    values = self.numpy()
    if dim is None:
        return _like(self, np.asarray(values.argmax(), dtype=np.int64))
    found = values.argmax(axis=_axis("argmax", self, dim))
    return _like(self, np.expand_dims(found, dim) if keepdim else found)


def _converted(dtype: np.dtype) -> Callable[[Tensor], Tensor]:
    def method(self: Tensor) -> Tensor:
        if self.dtype == dtype:
            return self
        return _like(self, self.numpy().astype(dtype))

    method.__doc__ = f"The elements as {dtype.name} (the tensor itself when it is; else a copy outside the graph)."
    return method


def _index_list(i: int) -> slice:
    return slice(i, i + 1 if i != -1 else None)


_native_getitem = Tensor.__getitem__


def _getitem(self: Tensor, key: Any) -> Tensor:
    """Indexing as the native tensor's (whole numbers, slices of step 1, ``...``; and ``x[ids]``, an int64
    tensor of ids as the whole key, which picks along the first axis as PyTorch's, in shape ``ids.shape +
    x.shape[1:]``, with the gradient), and besides a list of whole numbers along one axis (``x[:, [-1],
    :]``), which keeps that axis.

    ``x[ids]``: negative ids count from the end; ids on the CPU index a tensor on either device (they are
    checked: one out of range raises ``IndexError``), ids on the GPU a tensor there, read where they are
    and not checked (that would copy them back): an id that is not a row gives a row of NaN. A float
    tensor as the key raises ``IndexError``, ids on the GPU for a tensor on the CPU ``RuntimeError``."""
    items = key if isinstance(key, tuple) else (key,)
    lists = [p for p, item in enumerate(items) if isinstance(item, list)]
    if not lists:
        return _native_getitem(self, key)
    if len(lists) > 1 or any(item is Ellipsis for item in items):
        raise IndexError("index: one list of indices, without ..., is supported")
    at = lists[0]
    axis = at - sum(isinstance(item, int) for item in items[:at])
    pieces = [_native_getitem(self, items[:at] + (_index_list(i),) + items[at + 1:]) for i in items[at]]
    return cat(pieces, axis)


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two axes (the rest zero), outside the graph."""
    return _like(input, np.tril(input.numpy(), diagonal))


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two axes (the rest zero), outside the graph."""
    return _like(input, np.triu(input.numpy(), diagonal))


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> "tuple[Tensor, Tensor]":
    return _topk(input, k, dim, largest, sorted)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False) -> Tensor:
    return _multinomial(input, num_samples, replacement)


def argmax(input: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    return _argmax(input, dim, keepdim)


Tensor.masked_fill = _masked_fill
Tensor.topk = _topk
Tensor.multinomial = _multinomial
Tensor.argmax = _argmax
Tensor.tril = tril
Tensor.float = _converted(float32)
Tensor.double = _converted(float64)
Tensor.long = _converted(int64)
Tensor.__lt__ = _comparison(np.less)
Tensor.__le__ = _comparison(np.less_equal)
Tensor.__gt__ = _comparison(np.greater)
Tensor.__ge__ = _comparison(np.greater_equal)
Tensor.__getitem__ = _getitem
