"""``textnet.optim``: ``SGD`` (with momentum), ``Adam`` and ``AdamW``, as ``torch.optim``'s, over parameter
groups. Each group's ``lr`` may be set between steps (``optimizer.param_groups[0]["lr"] = lr``, as
nanoGPT's schedule does), or by a scheduler of ``textnet.optim.lr_scheduler``; its ``weight_decay`` is
read once, and β, ε and momentum are the optimizer's.
"""

import weakref
from copy import deepcopy
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from .. import _native
from .._tensor import Tensor

Params = Union[Iterable[Tensor], Iterable[Dict[str, Any]]]


class Optimizer:
    """The optimizers' base: ``param_groups`` (a list of dicts with ``params``, ``lr``, ``weight_decay``
    and the optimizer's other settings), ``zero_grad()`` and ``step()``."""

    def __init__(self, params: Params, defaults: Dict[str, Any], kind: str) -> None:
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__}: the parameter list is empty")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = defaults
        self.param_groups: List[Dict[str, Any]] = []
        for index, group in enumerate(groups):
            if not isinstance(group, dict):
                raise ValueError(f"{type(self).__name__}: group {index} is not a dict; give tensors or dicts, not both")
            params_of = group["params"]
            merged = dict(defaults, **group)
            merged["params"] = [params_of] if isinstance(params_of, Tensor) else list(params_of)
            for key in defaults:
                if key not in ("lr", "weight_decay") and merged[key] != defaults[key]:
                    raise ValueError(
                        f"{type(self).__name__}: group {index} sets {key}={merged[key]!r}; in textnet only lr and "
                        "weight_decay differ between groups"
                    )
            self.param_groups.append(merged)
        self._decays = [group["weight_decay"] for group in self.param_groups]
        self._pushed: Optional[List[float]] = None
        _live.add(self)
        self._native = _native.Optimizer(
            kind,
            [(group["params"], float(group["lr"]), float(group["weight_decay"])) for group in self.param_groups],
            momentum=float(defaults.get("momentum", 0.0)),
            betas=tuple(defaults.get("betas", (0.9, 0.999))),
            eps=float(defaults.get("eps", 1e-8)),
        )

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Optimizer":
        """``copy.deepcopy``, as PyTorch's: the groups and every parameter's state copied; the parameters
        are their deep copies (the model's copies when the model is copied in the same call, as in
        ``copy.deepcopy((model, optimizer))``)."""
        copy = object.__new__(type(self))
        memo[id(self)] = copy
        for key, value in self.__dict__.items():
            if key != "_native":
                setattr(copy, key, deepcopy(value, memo))
        copy._native = self._native.deep_copy_onto([group["params"] for group in copy.param_groups])
        _live.add(copy)
        return copy

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets every parameter's gradient (``set_to_none`` is always so: a next backward starts from
        nothing either way)."""
        for group in self.param_groups:
            for parameter in group["params"]:
                parameter.grad = None

    def step(self) -> None:
        """Updates every parameter that has a gradient, in place, each group at its ``lr`` now."""
        decays = [group["weight_decay"] for group in self.param_groups]
        if decays != self._decays:
            raise ValueError(f"{type(self).__name__}: a group's weight_decay changed; in textnet only lr may change")
        rates = self._rates()
        self._native.step(rates)
        self._pushed = rates

    def _rates(self) -> List[float]:
        return [float(group["lr"]) for group in self.param_groups]


class SGD(Optimizer):
    """SGD, with heavy-ball momentum when ``momentum`` > 0 (no dampening, no Nesterov) and L2
    ``weight_decay``."""

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if dampening != 0.0 or nesterov:
            raise ValueError("SGD: dampening and nesterov are not in textnet")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}, "sgd")


class Adam(Optimizer):
    """Adam with bias correction and L2 ``weight_decay`` (no AMSGrad). ``fused`` is taken and ignored: on
    the GPU every step is one multi-tensor update."""

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 fused: Any = None) -> None:
        if amsgrad:
            raise ValueError("Adam: amsgrad is not in textnet")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}, "adam")


class AdamW(Optimizer):
    """Adam with decoupled weight decay: θ shrinks by lr·weight_decay·θ each step."""

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 fused: Any = None) -> None:
        if amsgrad:
            raise ValueError("AdamW: amsgrad is not in textnet")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}, "adamw")


# Every optimizer alive: a compiled step pushes their rates to the GPU before each call, since a replay
# does not run the Python that sets them.
_live: "weakref.WeakSet[Optimizer]" = weakref.WeakSet()


def _push_rates() -> bool:
    """Sets every live optimizer's rates for its next step; True when some group's rate changed apart
    from its optimizer's other groups' (a captured step keeps the proportions it recorded)."""
    changed = False
    for optimizer in list(_live):
        rates = optimizer._rates()
        if rates != optimizer._pushed:  # the rates the native optimizer holds: each call to step() sets them
            changed |= optimizer._native.set_lrs(rates)
            optimizer._pushed = rates
    return changed


from . import lr_scheduler  # noqa: E402

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "lr_scheduler"]
