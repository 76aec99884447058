"""textnet from Python: small neural networks trained with hand-written fused CUDA kernels (or their CPU
reference), on NumPy arrays.

    import textnet
    (X, y), (X_test, y_test) = textnet.datasets.mnist("fashion")
    model = textnet.Sequential("Linear(784, 128), ReLU, Linear(128, 10)", metrics=["accuracy"])
    history = model.fit(X, y, epochs=10, validation_split=0.1)
    print(model.evaluate(X_test, y_test))     # [loss, accuracy]
    model.save("fashion.safetensors")         # the file `textnet classify` reads

Layers mirror ``torch.nn`` (`Linear`, `ReLU`, `Sigmoid`, `Tanh`, `GELU`, `Dropout`, `Conv2d`,
`MaxPool2d`, `Flatten`), `fit` mirrors Keras (`textnet.keras`). Errors are exceptions carrying the
command line's one-line messages: `ValueError` for bad arguments or data, `FileNotFoundError`,
`RuntimeError` for the GPU.

Models written as PyTorch's (a `textnet.nn.Module` with `forward`, trained by the user's loop) use the
tensors here (`textnet.tensor`, `randn`, `no_grad`, …), `textnet.nn` and `textnet.optim`; a training
step captured as a CUDA graph is `textnet.compile(step)`, and `textnet.save`/`textnet.load` write and
read a `state_dict` as safetensors. `textnet.from_torch(module)` and `Module.to_torch()` convert the
layers both libraries have; `textnet.set_precision("bf16")` puts the GPU's products on the tensor cores.
"""

from . import _native
from ._nvrtc import register_nvrtc as _register_nvrtc

_register_nvrtc()

from . import callbacks, datasets, keras, nn, optim, tensorboard  # noqa: E402
from ._compile import CompiledStep, compile  # noqa: E402
from ._tensor import (  # noqa: E402
    Tensor,
    arange,
    argmax,
    cat,
    double,
    float32,
    float64,
    from_numpy,
    full,
    int64,
    is_grad_enabled,
    long,
    manual_seed,
    multinomial,
    no_grad,
    ones,
    randn,
    stack,
    tensor,
    topk,
    tril,
    triu,
    zeros,
)
from .language import TextModel, Transformer  # noqa: E402
from .keras import (  # noqa: E402
    GELU,
    Conv2d,
    Dropout,
    Flatten,
    History,
    Layer,
    Linear,
    MaxPool2d,
    NeuralNetworkGPU,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from .serialization import load, save  # noqa: E402
from .interop import from_torch  # noqa: E402

__version__: str = _native.__version__

__all__ = [
    "GELU",
    "Conv2d",
    "Dropout",
    "Flatten",
    "History",
    "Layer",
    "Linear",
    "MaxPool2d",
    "NeuralNetworkGPU",
    "ReLU",
    "Sequential",
    "Sigmoid",
    "Tanh",
    "CompiledStep",
    "Tensor",
    "TextModel",
    "Transformer",
    "arange",
    "argmax",
    "callbacks",
    "cat",
    "compile",
    "datasets",
    "double",
    "float32",
    "float64",
    "from_numpy",
    "from_torch",
    "get_precision",
    "full",
    "int64",
    "is_grad_enabled",
    "keras",
    "load",
    "long",
    "manual_seed",
    "multinomial",
    "nn",
    "no_grad",
    "ones",
    "optim",
    "randn",
    "save",
    "selftest",
    "set_precision",
    "stack",
    "tensor",
    "topk",
    "tril",
    "triu",
    "zeros",
]


def selftest(quick: bool = False, only: "list[str] | None" = None, seed: "int | None" = None) -> "list[dict]":
    """Checks every GPU kernel against the CPU reference on this machine's GPU, as ``textnet selftest``
    does, and returns the check table: one dict per check with ``kernel``, ``shape``, ``rel_error``,
    ``tolerance``, ``passed`` (and the ``seed`` and ``device``). ``quick`` skips the largest shapes;
    ``only`` names pipelines or groups (``["fit"]``, ``["training"]``). Raises ``RuntimeError`` without a
    usable GPU."""
    return _native.selftest(quick=quick, only=only, seed=seed)


def set_precision(precision: str) -> None:
    """How the GPU's products (``matmul``, ``linear``, attention, the convolutions; forward and backward)
    multiply from now on:

    - ``"fp32"`` (the default): ``matmul`` and ``linear`` on the CUDA cores, the convolutions on the
      tensor cores in 3xTF32, fp32's accuracy;
    - ``"tf32"``: the convolutions in one TF32 product (operands truncated to a 10-bit mantissa, fp32
      sums), as PyTorch's convolutions by default (``torch.backends.cudnn.allow_tf32``); ``matmul`` and
      ``linear`` stay fp32, as PyTorch's by default;
    - ``"bf16"``: products on the tensor cores, operands rounded to bf16 and summed in fp32, as PyTorch's
      bf16 autocast.

    Tensors, LayerNorm, softmax, losses and the optimizer stay fp32. It is one setting for the GPU, as ``torch.set_float32_matmul_precision``. On the
    CPU it is accepted and changes nothing (the CPU always computes in the tensors' own dtype). A step
    that ``textnet.compile`` captured before the change is captured again at its next call. Raises
    ``ValueError`` for another name."""
    _native.set_precision(precision)


def get_precision() -> str:
    """The precision ``set_precision`` chose: ``"fp32"``, ``"tf32"`` or ``"bf16"``."""
    return _native.precision()
