"""The layers of ``textnet.nn``, as ``torch.nn``'s, each a ``Module`` over ``functional``'s ops with
PyTorch's parameter names and initialisation (drawn from the generator ``textnet.manual_seed`` seeds);
and the containers ``Sequential``, ``ModuleList`` and ``ModuleDict``.
"""

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _native
from .._tensor import Tensor, float32
from . import functional as F
from .module import Module, Parameter


def _uniform(shape: Tuple[int, ...], fan_in: int, dtype: Any) -> Parameter:
    """A parameter drawn from U(−1/√fan_in, 1/√fan_in), as PyTorch initialises ``Linear``."""
    draws = _native.uniform_init(int(np.prod(shape, dtype=np.int64)), fan_in)
    return Parameter(Tensor(draws.reshape(shape).astype(dtype or float32)))


def _placed(parameter: Parameter, device: Optional[str]) -> Parameter:
    return parameter if device in (None, "cpu") else Parameter(parameter.to(device))


class Linear(Module):
    """y = x·Wᵀ + b over the last axis: ``weight`` ``[out_features, in_features]``, ``bias``
    ``[out_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Optional[str] = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _placed(_uniform((out_features, in_features), in_features, dtype), device)
        if bias:
            self.bias = _placed(_uniform((out_features,), in_features, dtype), device)
        else:
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """Rows of ``weight`` ``[num_embeddings, embedding_dim]`` (drawn from N(0, 1)) by int64 id; the row
    ``padding_idx`` starts at zero and gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 device: Optional[str] = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        draws = _native.normal_draws(num_embeddings * embedding_dim).reshape(num_embeddings, embedding_dim)
        draws = draws.astype(dtype or float32)
        if padding_idx is not None:
            draws[padding_idx] = 0
        self.weight = _placed(Parameter(Tensor(draws)), device)

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        padding = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}"


class LayerNorm(Module):
    """LayerNorm over the last axis, of size ``normalized_shape``: ``weight`` ones and ``bias`` zeros when
    ``elementwise_affine`` (``bias=False`` leaves the bias out, as nanoGPT's)."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Optional[str] = None,
                 dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"LayerNorm: textnet normalises over the last axis only, got normalized_shape {shape}")
        self.normalized_shape, self.eps = shape, eps
        dtype = dtype or float32
        affine = {"weight": (elementwise_affine, np.ones), "bias": (elementwise_affine and bias, np.zeros)}
        for name, (present, fill) in affine.items():
            parameter = _placed(Parameter(Tensor(fill(shape, dtype=dtype))), device) if present else None
            self.register_parameter(name, parameter)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Dropout(Module):
    """Zeroes each element with probability ``p`` while training and scales the rest by 1/(1−p): the
    engine's dropout layer, whose step counter moves to the GPU at its first forward there, so that a
    step captured by ``textnet.compile`` draws a new mask at each replay (on the CPU each forward in
    training draws the next step's mask). Its seed is the last ``textnet.manual_seed``'s, and each layer
    made takes its own site, so that the same model built after the same seed drops the same elements.

    textnet's own use: given as ``dropout_p`` to ``F.scaled_dot_product_attention`` (with
    ``is_causal=True``), the layer drops the attention's probabilities."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: the probability must be in [0, 1], got {p}")
        self.p = p
        self.layer = _native.DropoutLayer(p)

    def forward(self, input: Tensor) -> Tensor:
        return self.layer.forward(input, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _pair(name: str, what: str, value: Union[int, Sequence[int]]) -> "tuple[int, int]":
    """``value`` (a whole number ≥ 0 or a pair of them) as a pair."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
        raise ValueError(f"{name}: {what} must be a whole number ≥ 0 or a pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def _square(name: str, what: str, value: Union[int, Sequence[int]]) -> int:
    """``value`` as one number, for an op whose windows are alike on both axes."""
    first, second = _pair(name, what, value)
    if first != second:
        raise ValueError(f"{name}: textnet takes one {what} for both axes, got {value!r}")
    return first


class Conv2d(Module):
    """The 2-D convolution (cross-correlation) of ``[N, C, H, W]`` images: ``weight`` ``[out_channels,
    in_channels, KH, KW]`` and ``bias`` ``[out_channels]``, each drawn from U(−1/√fan_in, 1/√fan_in) with
    fan_in = in_channels·KH·KW, as PyTorch's. ``stride`` and ``padding`` (zeros) are one number for both
    axes (or ``padding="same"`` for an odd kernel at stride 1, ``"valid"``); textnet has neither
    ``dilation`` nor ``groups``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Sequence[int]],
                 stride: Union[int, Sequence[int]] = 1, padding: Union[int, str, Sequence[int]] = 0,
                 dilation: Union[int, Sequence[int]] = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Optional[str] = None, dtype: Any = None) -> None:
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d: padding_mode={padding_mode!r} is not in textnet (zeros only)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size)
        self.stride, self.padding = stride, padding
        self.dilation, self.groups = dilation, groups
        F._conv_arguments(self.kernel_size, stride, padding, dilation, groups)
        fan_in = in_channels * self.kernel_size[0] * self.kernel_size[1]
        self.weight = _placed(_uniform((out_channels, in_channels) + self.kernel_size, fan_in, dtype), device)
        if bias:
            self.bias = _placed(_uniform((out_channels,), fan_in, dtype), device)
        else:
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, bias={self.bias is not None}")


class MaxPool2d(Module):
    """The max over ``kernel_size``×``kernel_size`` windows of ``[N, C, H, W]`` images, ``stride`` apart
    (the kernel size when None), over the input padded by ``padding`` with −∞."""

    def __init__(self, kernel_size: Union[int, Sequence[int]], stride: Optional[Union[int, Sequence[int]]] = None,
                 padding: Union[int, Sequence[int]] = 0, dilation: Union[int, Sequence[int]] = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode
        F._pool_arguments(kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def forward(self, input: Tensor) -> Tensor:
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self) -> str:
        stride = self.kernel_size if self.stride is None else self.stride
        return f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}"


class ReLU(Module):
    def forward(self, input: Tensor) -> Tensor:
        return input.relu()


class GELU(Module):
    """GELU in its tanh form, the one textnet has (``approximate="tanh"``)."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        return input.gelu(self.approximate)


class Tanh(Module):
    def forward(self, input: Tensor) -> Tensor:
        return input.tanh()


class Sigmoid(Module):
    def forward(self, input: Tensor) -> Tensor:
        return input.sigmoid()


class Softmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return input.softmax(self.dim)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input: Tensor) -> Tensor:
        return input.flatten(self.start_dim, self.end_dim)


class Identity(Module):
    def forward(self, input: Tensor) -> Tensor:
        return input


class Sequential(Module):
    """Modules applied in order, named ``0``, ``1``, … (or by the keys of an ``OrderedDict``)."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def forward(self, input: Any) -> Any:
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, index: Union[int, slice]) -> Any:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*modules[index])
        return modules[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    """A list of modules, named by index: ``blocks.0.attn.weight``."""

    def __init__(self, modules: Optional[Iterable[Module]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, index: int) -> str:
        count = len(self._modules)
        if not -count <= index < count:
            raise IndexError(f"ModuleList: index {index} is out of range for {count} modules")
        return str(index % count)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        return self._modules[self._index(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(self._index(index), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self


class ModuleDict(Module):
    """Modules by name (``transformer.wte.weight``), in insertion order."""

    def __init__(self, modules: Optional[Union[Mapping[str, Module], Iterable[Tuple[str, Module]]]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def items(self) -> Iterable[Tuple[str, Module]]:
        return self._modules.items()

    def update(self, modules: Union[Mapping[str, Module], Iterable[Tuple[str, Module]]]) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for key, module in pairs:
            self[key] = module


__all__ = [
    "GELU", "Conv2d", "Dropout", "MaxPool2d", "Embedding", "Flatten", "Identity", "LayerNorm", "Linear", "ModuleDict", "ModuleList",
    "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh",
]
