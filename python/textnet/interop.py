"""``textnet.from_torch(module)`` and ``Module.to_torch()``: a tree of the layers both libraries have made
again in the other one, under the same names, its parameters copied by their ``state_dict`` names.

The layers: ``Linear``, ``Embedding``, ``LayerNorm``, ``Conv2d``, ``MaxPool2d``, ``Dropout``, ``ReLU``,
``GELU`` (the tanh form, textnet's only one), ``Tanh``, ``Sigmoid``, ``Softmax``, ``Flatten``,
``Identity``; the containers ``Sequential``, ``ModuleList`` and ``ModuleDict``. A module of another
class (a model's own ``Module`` subclass, whose ``forward`` is code) is refused with ``TypeError``: convert
its layers, or copy its ``state_dict``, which the same model in either library loads.
"""

from collections import OrderedDict
from typing import Any, Callable, Dict

import numpy as np

from . import nn
from ._tensor import float64


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError("textnet's conversions to and from PyTorch need torch (pip install torch)") from e
    return torch


def _is_float64(module: Any) -> bool:
    first = next(iter(module.parameters()), None)
    return first is not None and str(first.dtype) in ("float64", "torch.float64")


def _torch_gelu(torch: Any, m: Any) -> Any:
    return torch.nn.GELU(approximate=m.approximate)


def _textnet_gelu(m: Any) -> nn.Module:
    if m.approximate != "tanh":
        raise ValueError(f"from_torch: GELU(approximate={m.approximate!r}) is not in textnet, whose GELU is the "
                         "tanh form (approximate='tanh')")
    return nn.GELU("tanh")


def _textnet_embedding(m: Any, dtype: Any) -> nn.Module:
    if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
        raise ValueError("from_torch: Embedding's max_norm, scale_grad_by_freq and sparse are not in textnet")
    return nn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx, dtype=dtype)


# Each layer by its class name (both libraries use the same), made from the other library's layer `m`
# with parameters of `dtype` (float64 or None).
_TEXTNET_LAYERS: Dict[str, Callable[[Any, Any], nn.Module]] = {
    "Linear": lambda m, dtype: nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, dtype=dtype),
    "Embedding": _textnet_embedding,
    "LayerNorm": lambda m, dtype: nn.LayerNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.weight is not None,
                                               bias=m.bias is not None, dtype=dtype),
    "Conv2d": lambda m, dtype: nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride,
                                         padding=m.padding, dilation=m.dilation, groups=m.groups,
                                         bias=m.bias is not None, padding_mode=m.padding_mode, dtype=dtype),
    "MaxPool2d": lambda m, _: nn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, m.return_indices,
                                           m.ceil_mode),
    "Dropout": lambda m, _: nn.Dropout(m.p),
    "ReLU": lambda m, _: nn.ReLU(),
    "GELU": lambda m, _: _textnet_gelu(m),
    "Tanh": lambda m, _: nn.Tanh(),
    "Sigmoid": lambda m, _: nn.Sigmoid(),
    "Softmax": lambda m, _: nn.Softmax(-1 if m.dim is None else m.dim),
    "Flatten": lambda m, _: nn.Flatten(m.start_dim, m.end_dim),
    "Identity": lambda m, _: nn.Identity(),
}

_TORCH_LAYERS: Dict[str, Callable[[Any, Any, Any], Any]] = {
    "Linear": lambda t, m, dtype: t.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, dtype=dtype),
    "Embedding": lambda t, m, dtype: t.nn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx,
                                                    dtype=dtype),
    "LayerNorm": lambda t, m, dtype: t.nn.LayerNorm(m.normalized_shape, eps=m.eps,
                                                    elementwise_affine=m.weight is not None,
                                                    bias=m.bias is not None, dtype=dtype),
    "Conv2d": lambda t, m, dtype: t.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride,
                                              padding=m.padding, bias=m.bias is not None, dtype=dtype),
    "MaxPool2d": lambda t, m, _: t.nn.MaxPool2d(m.kernel_size, m.stride, m.padding),
    "Dropout": lambda t, m, _: t.nn.Dropout(m.p),
    "ReLU": lambda t, m, _: t.nn.ReLU(),
    "GELU": lambda t, m, _: t.nn.GELU(approximate=m.approximate),
    "Tanh": lambda t, m, _: t.nn.Tanh(),
    "Sigmoid": lambda t, m, _: t.nn.Sigmoid(),
    "Softmax": lambda t, m, _: t.nn.Softmax(dim=m.dim),
    "Flatten": lambda t, m, _: t.nn.Flatten(m.start_dim, m.end_dim),
    "Identity": lambda t, m, _: t.nn.Identity(),
}

_CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")


def _kind(module: Any, library: Any, what: str) -> str:
    """The class name of ``module`` when it is exactly one of ``library``'s layers or containers (a
    subclass may compute otherwise), else the ``TypeError``."""
    name = type(module).__name__
    if getattr(library, name, None) is type(module) and (name in _TEXTNET_LAYERS or name in _CONTAINERS):
        return name
    known = ", ".join(sorted(list(_TEXTNET_LAYERS) + list(_CONTAINERS)))
    raise TypeError(f"{what}: {type(module).__module__}.{name} has no counterpart; the layers converted are {known}")


def _textnet_tree(module: Any, torch: Any) -> nn.Module:
    kind = _kind(module, torch.nn, "from_torch")
    children = [(name, _textnet_tree(child, torch)) for name, child in module.named_children()]
    if kind == "Sequential":
        return nn.Sequential(OrderedDict(children))
    if kind == "ModuleList":
        return nn.ModuleList(child for _, child in children)
    if kind == "ModuleDict":
        return nn.ModuleDict(children)
    return _TEXTNET_LAYERS[kind](module, float64 if _is_float64(module) else None)


def _torch_tree(module: nn.Module, torch: Any) -> Any:
    kind = _kind(module, nn, "to_torch")
    children = [(name, _torch_tree(child, torch)) for name, child in module.named_children()]
    if kind == "Sequential":
        return torch.nn.Sequential(OrderedDict(children))
    if kind == "ModuleList":
        return torch.nn.ModuleList(child for _, child in children)
    if kind == "ModuleDict":
        return torch.nn.ModuleDict(children)
    return _TORCH_LAYERS[kind](torch, module, torch.float64 if _is_float64(module) else torch.float32)


def from_torch(module: Any) -> nn.Module:
    """The ``torch.nn`` tree ``module`` as the same textnet modules on the CPU, its parameters copied
    under their ``state_dict`` names, in training or evaluation as ``module`` is."""
    torch = _torch()
    ours = _textnet_tree(module, torch)
    ours.load_state_dict({name: value.detach().cpu().numpy() for name, value in module.state_dict().items()})
    return ours.train(module.training)


def to_torch(module: nn.Module) -> Any:
    """The textnet tree ``module`` as the same ``torch.nn`` modules on the CPU, its parameters copied
    under their ``state_dict`` names, in training or evaluation as ``module`` is."""
    torch = _torch()
    theirs = _torch_tree(module, torch)
    theirs.load_state_dict({name: torch.from_numpy(np.array(value.numpy())) for name, value in module.state_dict().items()})
    return theirs.train(module.training)


__all__ = ["from_torch", "to_torch"]
