"""What PyTorch computes, written in NumPy (float64): the layers textnet shares with ``torch.nn``, run from a
state dict under torch's names. The interop tests compare with PyTorch itself when it is installed and
with this reference otherwise, so that a test run without torch (a large download) still checks that a model
computes, names and stores its weights as ``torch.nn`` would.

A network is a list of ``(name, layer)`` pairs, ``layer`` one of the strings ``"relu"``, ``"tanh"``,
``"sigmoid"``, ``"gelu_tanh"``, ``"flatten"``, ``"dropout"`` (evaluation: the identity), or a tuple
``("linear",)``, ``("conv2d", stride, padding)``, ``("max_pool2d", kernel)``; a layer with parameters
reads ``state[f"{name}.weight"]`` and, if present, ``state[f"{name}.bias"]``, as ``nn.Sequential`` names
them.
"""

import numpy as np


def linear(x, weight, bias=None):
    """``F.linear``: x · Wᵀ + b, W of shape (out, in)."""
    y = x @ weight.T
    return y if bias is None else y + bias


def conv2d(x, weight, bias=None, stride=1, padding=0):
    """``F.conv2d``: cross-correlation of (n, c, h, w) with (out, c, kh, kw), zero padding on both axes."""
    kh, kw = weight.shape[2:]
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.einsum("ncijkl,ockl->noij", windows, weight)
    return y if bias is None else y + bias[None, :, None, None]


def max_pool2d(x, kernel):
    """``F.max_pool2d`` with stride = kernel and no padding: the rows and columns left over are dropped."""
    n, c, h, w = x.shape
    oh, ow = h // kernel, w // kernel
    return x[:, :, : oh * kernel, : ow * kernel].reshape(n, c, oh, kernel, ow, kernel).max(axis=(3, 5))


def gelu_tanh(x):
    """``nn.GELU(approximate="tanh")``."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


ELEMENTWISE = {
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "gelu_tanh": gelu_tanh,
    "dropout": lambda x: x,
    "flatten": lambda x: x.reshape(len(x), -1),
}


def forward(network, state, x):
    """The network's output for ``x`` in evaluation mode, in float64, its parameters read from ``state``
    (NumPy arrays, or anything ``np.asarray`` reads) by torch's names."""
    x = np.asarray(x, dtype=np.float64)
    for name, layer in network:
        if isinstance(layer, str):
            x = ELEMENTWISE[layer](x)
            continue
        weight = np.asarray(state[f"{name}.weight"], dtype=np.float64) if layer[0] != "max_pool2d" else None
        bias = state.get(f"{name}.bias")
        bias = None if bias is None else np.asarray(bias, dtype=np.float64)
        if layer[0] == "linear":
            x = linear(x, weight, bias)
        elif layer[0] == "conv2d":
            x = conv2d(x, weight, bias, stride=layer[1], padding=layer[2])
        elif layer[0] == "max_pool2d":
            x = max_pool2d(x, layer[1])
        else:
            raise ValueError(f"no reference for {layer!r}")
    return x

