"""The ops of ``textnet.nn`` as functions, as ``torch.nn.functional``'s (``F.relu``, ``F.cross_entropy``,
``F.scaled_dot_product_attention``, …)."""

import math
from typing import Optional, Sequence, Union

import numpy as np

from .. import _native
from .._tensor import Tensor


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """y = x·Wᵀ + b."""
    return _native.linear(input, weight, bias)


def relu(input: Tensor) -> Tensor:
    return input.relu()


def gelu(input: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU in its tanh form, the one textnet has (PyTorch's default, the erf form, is not here)."""
    return input.gelu(approximate)


def tanh(input: Tensor) -> Tensor:
    return input.tanh()


def sigmoid(input: Tensor) -> Tensor:
    return input.sigmoid()


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    return input.softmax(dim)


def log_softmax(input: Tensor, dim: int = -1) -> Tensor:
    return input.log_softmax(dim)


def _mean_only(op: str, reduction: str) -> None:
    if reduction != "mean":
        raise ValueError(f"{op}: reduction={reduction!r} is not in textnet (reduction='mean' only)")


def cross_entropy(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """The mean of −log softmax(row)[target] over the rows whose target is not ``ignore_index``:
    ``input`` ``[N, C]`` (or ``[C]``, or ``[N, C, d1, …]``: classes on axis 1), ``target`` int64 of
    ``input``'s shape without the class axis."""
    _mean_only("cross_entropy", reduction)
    return _native.cross_entropy(input, target, ignore_index)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """The mean of (input − target)² over every element; both of one shape."""
    _mean_only("mse_loss", reduction)
    return _native.mse_loss(input, target)


def dropout(input: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """``input`` with each element zeroed with probability ``p`` and the rest scaled by 1/(1−p) when
    ``training``; the masks come from the generator ``textnet.manual_seed`` seeds."""
    return _native.dropout(input, p, training)


def layer_norm(input: Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last axis, whose size ``normalized_shape`` must be."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if shape != tuple(input.shape[-1:]):
        raise ValueError(
            f"layer_norm: normalized_shape {list(shape)} is not the last axis of shape {list(input.shape)} "
            "(textnet normalises over the last axis only)"
        )
    return _native.layer_norm(input, weight, bias, eps)


def embedding(input: Tensor, weight: Tensor, padding_idx: Optional[int] = None) -> Tensor:
    """The rows of ``weight`` at the int64 ids ``input``: shape ``input.shape + [embedding_dim]``."""
    return _native.embedding(input, weight, padding_idx)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None) -> Tensor:
    """softmax(q·kᵀ/√D)·v over ``[B, H, T, D]`` tensors, each query seeing only the keys up to its own
    when ``is_causal``. With ``dropout_p`` > 0 the probabilities get dropout, and the attention runs as
    its ops (the T×T probabilities kept for the backward) instead of the fused kernel. textnet has
    neither ``attn_mask`` nor ``scale``."""
    if attn_mask is not None or scale is not None:
        raise ValueError("scaled_dot_product_attention: attn_mask and scale are not in textnet")
    if dropout_p == 0.0:
        return _native.scaled_dot_product_attention(query, key, value, is_causal)
    scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(key.size(-1)))
    if is_causal:
        rows, columns = scores.shape[-2:]
        scores = scores.masked_fill(np.triu(np.ones((rows, columns), dtype=np.int64), 1), float("-inf"))
    return dropout(scores.softmax(-1), dropout_p) @ value
