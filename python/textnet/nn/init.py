"""``textnet.nn.init``: parameters refilled in place, outside the graph, as ``torch.nn.init``'s, from the
generator ``textnet.manual_seed`` seeds."""

import numpy as np

from .. import _native
from .._tensor import Tensor


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fills ``tensor`` with draws of N(mean, std²)."""
    draws = _native.normal_draws(tensor.numel()).reshape(tuple(tensor.shape))
    return tensor.copy_(draws.astype(np.float64) * std + mean)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fills ``tensor`` with draws of U(a, b)."""
    draws = _native.uniform_draws(tensor.numel()).reshape(tuple(tensor.shape))
    return tensor.copy_(a + (b - a) * draws)


def constant_(tensor: Tensor, val: float) -> Tensor:
    return tensor.copy_(np.full(tuple(tensor.shape), val, dtype=np.float64))


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


__all__ = ["constant_", "normal_", "ones_", "uniform_", "zeros_"]
