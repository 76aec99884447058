"""``textnet.nn.utils``: ``clip_grad_norm_``."""

from typing import Iterable, Union

import numpy as np

from .. import _native
from .._tensor import Tensor


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scales the gradients of ``parameters`` in place so that their global L2 norm is at most
    ``max_norm``; returns the norm they had."""
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_: norm_type={norm_type} is not in textnet (2.0 only)")
    listed = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    with_grad = [p for p in listed if p.grad is not None]
    if not with_grad:
        return Tensor(np.zeros((), dtype=np.float32))
    return _native.clip_grad_norm(with_grad, float(max_norm))
