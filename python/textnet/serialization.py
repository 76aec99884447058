"""``textnet.save`` and ``textnet.load``: a module's ``state_dict`` as a safetensors file under the
module's own names (``transformer.h.0.attn.c_attn.weight``), each tensor in its dtype (F32, F64, I64):
the file ``safetensors.torch.load_file`` reads for the same PyTorch model's ``load_state_dict``.
``load`` also reads a ``textnet fit`` model file, as a ``Sequential``.
"""

import os
from collections import OrderedDict
from typing import Any, Mapping, Union

from . import _native, keras
from ._tensor import Tensor, tensor

PathLike = Union[str, "os.PathLike[str]"]


def save(obj: Any, path: PathLike) -> None:
    """Writes ``obj`` (a ``textnet.nn.Module``, whose ``state_dict()`` is written, or a mapping of names
    to tensors or NumPy arrays) to ``path`` as a safetensors file, replacing it only once the new one is
    whole. A tied weight is written under each of its names, as PyTorch's ``state_dict`` lists it."""
    from .nn import Module

    state = obj.state_dict() if isinstance(obj, Module) else obj
    if not isinstance(state, Mapping):
        raise TypeError(f"save: give a Module or a mapping of names to tensors, got {type(obj).__name__}")
    named = []
    for name, value in state.items():
        if not isinstance(name, str):
            raise TypeError(f"save: the names must be strings, got {name!r}")
        named.append((name, value if isinstance(value, Tensor) else tensor(value)))
    _native.save_tensors(os.fspath(path), named)


def load(path: PathLike) -> Any:
    """The tensors of the safetensors file at ``path`` as an ordered dict of name to tensor, in the
    file's order (a state dict for ``Module.load_state_dict``); a ``textnet fit`` model file (its
    metadata names its format) is read as a ``Sequential``. Raises ``FileNotFoundError`` or
    ``ValueError`` (not a safetensors file, a dtype other than F32, F64 and I64)."""
    if _native.file_kind(os.fspath(path)) is not None:
        return keras.load(path)
    return OrderedDict(_native.load_tensors(os.fspath(path)))
