"""``Module`` and ``Parameter``, as ``torch.nn``'s: a module subclassed with ``__init__`` and ``forward``
registers the ``Parameter``s, sub-modules and buffers assigned to its attributes, and names them as
PyTorch does (``fc.weight``, ``blocks.0.attn.bias``), so that its ``state_dict`` loads into the same
PyTorch model and back.
"""

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import numpy as np

from .._tensor import Tensor, int64


class Parameter(Tensor):
    """A tensor that a module trains: it requires a gradient, and assigned to a module's attribute it
    joins the module's ``parameters()``. Made from a tensor, it shares its elements."""

    def __new__(cls, data: Optional[Any] = None, requires_grad: bool = True) -> "Parameter":
        if data is None:
            data = np.zeros((0,), dtype=np.float32)
        return super().__new__(cls, data, requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """The base of every layer and model: subclass it, assign parameters and sub-modules in
    ``__init__`` (after ``super().__init__()``), compute in ``forward``, call the module to run it."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def _registry(self, name: str) -> Dict[str, Any]:
        registry = self.__dict__.get(name)
        if registry is None:
            raise AttributeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before assigning attributes"
            )
        return registry

    def __setattr__(self, name: str, value: Any) -> None:
        parameters = self.__dict__.get("_parameters")
        if isinstance(value, (Parameter, Module)):
            for registry in ("_parameters", "_modules", "_buffers"):
                self._registry(registry).pop(name, None)
            self.__dict__.pop(name, None)
            self._registry("_parameters" if isinstance(value, Parameter) else "_modules")[name] = value
        elif parameters is not None and name in parameters:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} to parameter {name!r}: a Parameter or None")
            parameters[name] = None
        elif self.__dict__.get("_modules") is not None and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} to module {name!r}: a Module or None")
            self._modules[name] = None
        elif self.__dict__.get("_buffers") is not None and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer {name!r}: a Tensor or None")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        for registry in ("_parameters", "_modules", "_buffers"):
            found = self.__dict__.get(registry)
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for registry in ("_parameters", "_modules", "_buffers"):
            found = self.__dict__.get(registry)
            if found is not None and name in found:
                del found[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, parameter: Optional[Parameter]) -> None:
        """Adds ``parameter`` (or None: a slot without one, as a layer without bias has) under ``name``."""
        if parameter is not None and not isinstance(parameter, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None")
        self._registry("_parameters")[name] = parameter

    def register_buffer(self, name: str, tensor: Optional[Tensor], persistent: bool = True) -> None:
        """Adds ``tensor``, state that is not trained, under ``name``; in the ``state_dict`` when
        ``persistent``."""
        self._registry("_buffers")[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Optional["Module"]) -> None:
        """Adds ``module`` as a child under ``name``."""
        self._registry("_modules")[name] = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        for name, module in self._modules.items():
            if module is not None:
                yield name, module

    def children(self) -> Iterator["Module"]:
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix: str = "") -> Iterator[Tuple[str, "Module"]]:
        """This module and every module under it, each once, with its dotted name ('' for this one)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{child}" if name else child, m) for child, m in module.named_children()]
            stack.extend(reversed(children))

    def modules(self) -> Iterator["Module"]:
        for _, module in self.named_modules():
            yield module

    def _named_members(self, registry: str, recurse: bool) -> Iterator[Tuple[str, Tensor]]:
        seen = set()
        modules = self.named_modules() if recurse else iter([("", self)])
        for prefix, module in modules:
            for name, member in getattr(module, registry).items():
                if member is None or id(member) in seen:
                    continue
                seen.add(id(member))
                yield (f"{prefix}.{name}" if prefix else name), member

    def named_parameters(self, recurse: bool = True) -> Iterator[Tuple[str, Parameter]]:
        """Every parameter under its PyTorch name, each once (a tied weight under its first name)."""
        return self._named_members("_parameters", recurse)  # type: ignore[return-value]

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, parameter in self.named_parameters(recurse):
            yield parameter

    def named_buffers(self, recurse: bool = True) -> Iterator[Tuple[str, Tensor]]:
        return self._named_members("_buffers", recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse):
            yield buffer

    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """Every parameter and persistent buffer under its PyTorch name, detached (sharing the elements);
        a tied weight appears under each of its names, as in PyTorch."""
        state: "OrderedDict[str, Tensor]" = OrderedDict()
        for prefix, module in self._all_named_modules():
            dot = f"{prefix}." if prefix else ""
            for name, parameter in module._parameters.items():
                if parameter is not None:
                    state[dot + name] = parameter.detach()
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent:
                    state[dot + name] = buffer.detach()
        return state

    def _all_named_modules(self) -> Iterator[Tuple[str, "Module"]]:
        """Every module under its every name (a module shared by two parents appears twice)."""
        yield "", self
        for name, child in self.named_children():
            for sub, module in child._all_named_modules():
                yield (f"{name}.{sub}" if sub else name), module

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copies ``state_dict``'s tensors or NumPy arrays into the parameters and buffers of the same
        names, in place. Raises ``ValueError`` naming the keys missing and unexpected (with ``strict``)
        or a shape that differs."""
        mine = self.state_dict()
        missing = [key for key in mine if key not in state_dict]
        unexpected = [key for key in state_dict if key not in mine]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append("missing keys " + ", ".join(repr(k) for k in missing))
            if unexpected:
                parts.append("unexpected keys " + ", ".join(repr(k) for k in unexpected))
            raise ValueError(f"load_state_dict of {type(self).__name__}: " + "; ".join(parts))
        for key, target in mine.items():
            if key not in state_dict:
                continue
            source = state_dict[key]
            shape = tuple(source.shape)
            if shape != tuple(target.shape):
                raise ValueError(
                    f"load_state_dict: {key!r} has shape {list(target.shape)} here, but the state dict's is {list(shape)}"
                )
        for prefix, module in self._all_named_modules():
            dot = f"{prefix}." if prefix else ""
            for name, buffer in module._buffers.items():
                # Ids on the host do not change in place: such a buffer is replaced.
                if dot + name in state_dict and buffer is not None and buffer.dtype == int64 and buffer.device == "cpu":
                    source = state_dict[dot + name]
                    module._buffers[name] = Tensor(np.asarray(source.numpy() if isinstance(source, Tensor) else source,
                                                              dtype=np.int64))
        for key, target in mine.items():
            if key in state_dict and not (target.dtype == int64 and target.device == "cpu"):
                target.copy_(state_dict[key])

    def train(self, mode: bool = True) -> "Module":
        """Switches training behaviour (dropout draws masks) on, or off with ``mode=False``, here and below."""
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def apply(self, fn: "Callable[[Module], Any]") -> "Module":
        """Calls ``fn`` on every module below, children first, then on this one (``_init_weights``)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, device: str) -> "Module":
        """Moves every parameter and buffer to ``device`` ("cpu" or "cuda"), in place: each becomes a copy
        there (a tied weight stays one tensor). Make optimizers after the move, over the new parameters."""
        moved: Dict[int, Tensor] = {}
        where = "cuda" if str(device).startswith("cuda") else str(device)
        for module in self.modules():
            for registry in (module._parameters, module._buffers):
                for name, value in registry.items():
                    if value is None or value.device == where:
                        continue
                    if id(value) not in moved:
                        copy = value.to(device)
                        if isinstance(value, Parameter):
                            copy = Parameter(copy, requires_grad=value.requires_grad)
                        moved[id(value)] = copy
                    registry[name] = moved[id(value)]
        return self

    def to_torch(self) -> Any:
        """This module as the same ``torch.nn`` modules on the CPU, its parameters copied under their
        ``state_dict`` names (``textnet.interop``: the layers both libraries have, and their containers)."""
        from ..interop import to_torch

        return to_torch(self)

    def cuda(self) -> "Module":
        return self.to("cuda")

    def cpu(self) -> "Module":
        return self.to("cpu")

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for parameter in self.parameters():
            parameter.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets every parameter's gradient (``set_to_none`` is always so: a next backward starts from
        nothing either way)."""
        for parameter in self.parameters():
            parameter.grad = None

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, module in self._modules.items():
            child = repr(module).replace("\n", "\n  ")
            lines.append(f"({name}): {child}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = "\n  ".join(([extra] if extra else []) + lines)
        return f"{type(self).__name__}(\n  {body}\n)"

    def __dir__(self) -> "list[str]":
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._modules) | set(self._buffers))
