"""The ops of ``textnet.nn`` as functions, as ``torch.nn.functional``'s (``F.relu``, ``F.cross_entropy``,
``F.scaled_dot_product_attention``, ``F.conv2d``, …)."""

import math
from typing import Any, Optional, Sequence, Union

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
    ``training``. The mask's seed is drawn on the host from the generator ``textnet.manual_seed`` seeds,
    so a step captured by ``textnet.compile`` would replay the one mask it recorded: in a compiled step
    use the layer ``nn.Dropout``, whose masks a captured step draws anew at each replay."""
    return _native.dropout(input, p, training)


def _conv_arguments(kernel_size: "tuple[int, int]", stride: Any, padding: Any, dilation: Any,
                    groups: int) -> "tuple[int, int]":
    """The stride and padding of ``conv2d`` as one number each, or the error naming what textnet lacks."""
    from .layers import _pair, _square

    if _pair("conv2d", "dilation", dilation) != (1, 1) or groups != 1:
        raise ValueError(f"conv2d: dilation {dilation!r} and groups {groups!r} are not in textnet (1 only)")
    stride = _square("conv2d", "stride", stride)
    if padding == "valid":
        return stride, 0
    if padding == "same":
        if stride != 1 or kernel_size[0] != kernel_size[1] or kernel_size[0] % 2 == 0:
            raise ValueError(f"conv2d: padding='same' takes stride 1 and a square odd kernel in textnet, got "
                             f"kernel {kernel_size} and stride {stride}")
        return stride, kernel_size[0] // 2
    return stride, _square("conv2d", "padding", padding)


def conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """The 2-D convolution (cross-correlation) of ``input`` ``[N, C, H, W]`` by ``weight`` ``[O, C, KH,
    KW]``, plus ``bias`` ``[O]``: output ``[N, O, OH, OW]``, OH = (H + 2·padding − KH) // stride + 1.
    ``stride`` and ``padding`` are one number for both axes (``padding`` also "valid" or "same")."""
    kernel = tuple(weight.shape[2:]) if len(weight.shape) == 4 else (1, 1)
    stride, padding = _conv_arguments(kernel, stride, padding, dilation, groups)
    return _native.conv2d(input, weight, bias, stride, padding)


def _pool_arguments(kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                    return_indices: bool) -> "tuple[int, int, int]":
    """The window, stride and padding of ``max_pool2d`` as one number each, or the error naming what
    textnet lacks."""
    from .layers import _pair, _square

    if _pair("max_pool2d", "dilation", dilation) != (1, 1) or ceil_mode or return_indices:
        raise ValueError("max_pool2d: dilation, ceil_mode and return_indices are not in textnet")
    kernel = _square("max_pool2d", "kernel_size", kernel_size)
    stride = kernel if stride is None else _square("max_pool2d", "stride", stride)
    return kernel, stride, _square("max_pool2d", "padding", padding)


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    """The max over each ``kernel_size``×``kernel_size`` window of ``input`` ``[N, C, H, W]``, windows
    ``stride`` apart (the kernel size when None), over the input padded by ``padding`` (at most half the
    window) with −∞. Of equal elements the first in the window wins, and gets the gradient."""
    kernel, stride, padding = _pool_arguments(kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    return _native.max_pool2d(input, kernel, stride, padding)


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
                                 dropout_p: Any = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None) -> Tensor:
    """softmax(q·kᵀ/√D)·v over ``[B, H, T, D]`` tensors, each query seeing only the keys up to its own
    when ``is_causal``. textnet has neither ``attn_mask`` nor ``scale``.

    ``dropout_p`` may be a number, as PyTorch's: above 0 the attention runs as its ops (the T×T
    probabilities kept for the backward) with ``dropout``'s mask, which a captured step would replay
    unchanged. textnet's own: ``dropout_p`` may be an ``nn.Dropout`` layer (nanoGPT's ``attn_dropout``),
    with ``is_causal=True``: the engine's causal attention then drops the probabilities by the layer's
    mask of its next step, a new one at each replay of a captured step (in evaluation, or at p = 0, no
    dropout)."""
    from .layers import Dropout

    if attn_mask is not None or scale is not None:
        raise ValueError("scaled_dot_product_attention: attn_mask and scale are not in textnet")
    if isinstance(dropout_p, Dropout):
        if not is_causal:
            raise ValueError("scaled_dot_product_attention: a Dropout layer as dropout_p takes is_causal=True "
                             "(it drops in textnet's causal attention)")
        if dropout_p.training and dropout_p.p > 0:
            return _causal_attention_with_dropout(query, key, value, dropout_p)
        dropout_p = 0.0
    if dropout_p == 0.0:
        return _native.scaled_dot_product_attention(query, key, value, is_causal)
    scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(key.size(-1)))
    if is_causal:
        rows, columns = scores.shape[-2:]
        scores = scores.masked_fill(np.triu(np.ones((rows, columns), dtype=np.int64), 1), float("-inf"))
    return dropout(scores.softmax(-1), dropout_p) @ value


def causal_self_attention(qkv: Tensor, n_head: int, dropout: Any = None) -> Tensor:
    """Causal self-attention of the packed rows ``qkv`` ``[B, T, 3C]`` (each position's ``[q | k | v]``, as
    ``nn.Linear(C, 3 * C)`` makes them, ``n_head`` heads side by side in each third) to ``[B, T, C]``, the
    heads side by side: what ``q, k, v = qkv.split(C, dim=2)``, the ``view``s and ``transpose``s into
    ``[B, H, T, D]``, ``scaled_dot_product_attention(q, k, v, is_causal=True)`` and
    ``y.transpose(1, 2).contiguous().view(B, T, C)`` compute, without their copies (flash-attn's
    ``flash_attn_qkvpacked_func``; textnet's own). ``dropout``: an ``nn.Dropout`` layer whose mask drops
    the probabilities while it is training (a new one at each replay of a captured step), or None."""
    from .layers import Dropout

    if dropout is not None and not isinstance(dropout, Dropout):
        raise TypeError(f"causal_self_attention: dropout must be an nn.Dropout layer or None, not "
                        f"{type(dropout).__name__}")
    if dropout is None or not dropout.training or dropout.p == 0:
        return _native.causal_self_attention(qkv, n_head)
    return _native.causal_self_attention(qkv, n_head, dropout.layer, True)


def _causal_attention_with_dropout(query: Tensor, key: Tensor, value: Tensor, layer: Any) -> Tensor:
    """The engine's causal attention over q, k, v ``[B, H, T, D]`` packed as its rows ``[B, T, 3·H·D]``,
    its probabilities dropped by ``layer``; the result back in ``[B, H, T, D]``."""
    shapes = {tuple(query.shape), tuple(key.shape), tuple(value.shape)}
    if len(shapes) != 1 or len(query.shape) != 4:
        raise ValueError(f"scaled_dot_product_attention: q, k and v must be of one shape [B, H, T, D], got "
                         f"{[list(t.shape) for t in (query, key, value)]}")
    batch, heads, time, dims = query.shape
    rows = [t.transpose(1, 2).reshape(batch, time, heads * dims) for t in (query, key, value)]
    packed = _native.cat(rows, 2)
    out = causal_self_attention(packed, heads, layer)
    return out.view(batch, time, heads, dims).transpose(1, 2)
