"""``textnet.nn``: models written as PyTorch's are, ``Module`` subclasses with ``__init__`` and
``forward`` over tensors with autograd, trained by the user's own loop (``loss.backward()``,
``optimizer.step()``). The layers here are ``torch.nn``'s, under PyTorch's parameter names; the
networks of ``fit``, in the style of Keras, are ``textnet.Sequential`` and its layers
(``textnet.keras``).

    import textnet
    from textnet import nn
    import textnet.nn.functional as F

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(784, 128), nn.Linear(128, 10)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))
"""

from . import functional, init, utils
from .layers import (
    GELU,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    MaxPool2d,
    ModuleDict,
    ModuleList,
    ReLU,
    Sequential,
    Sigmoid,
    Softmax,
    Tanh,
)
from .module import Module, Parameter

__all__ = [
    "GELU",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "Identity",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "ReLU",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "functional",
    "init",
    "utils",
]
