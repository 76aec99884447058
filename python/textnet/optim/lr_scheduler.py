"""``textnet.optim.lr_scheduler``: rates set per step, as ``torch.optim.lr_scheduler``'s. Each scheduler
sets every group's ``lr`` from the rate the group had when the scheduler was made (its
``initial_lr``) and the count of ``step()`` calls so far (``last_epoch``), in closed form.

    scheduler = CosineAnnealingLR(optimizer, T_max=5000, eta_min=1e-4, warmup=100)
    for step in range(5000):
        ...
        optimizer.step()
        scheduler.step()
"""

import math
from typing import Callable, List, Sequence, Union

from . import Optimizer


class LRScheduler:
    """The schedulers' base: ``step()``, ``get_last_lr()`` and ``last_epoch``; a subclass gives
    ``rate(base_lr, step)``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs: List[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def rate(self, base_lr: float, step: int, group: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no rate")

    def step(self) -> None:
        """Advances one step and sets every group's ``lr`` for it."""
        self.last_epoch += 1
        for index, (group, base_lr) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = self.rate(base_lr, self.last_epoch, index)

    def get_last_lr(self) -> List[float]:
        """Every group's rate as the last ``step()`` set it."""
        return [group["lr"] for group in self.optimizer.param_groups]


class LambdaLR(LRScheduler):
    """Each group's rate is its initial rate times ``lr_lambda(step)`` (one function, or one a group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 last_epoch: int = -1) -> None:
        groups = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(self.lr_lambdas) != groups:
            raise ValueError(f"LambdaLR: {len(self.lr_lambdas)} functions for {groups} parameter groups")
        super().__init__(optimizer, last_epoch)

    def rate(self, base_lr: float, step: int, group: int) -> float:
        return base_lr * self.lr_lambdas[group](step)


class CosineAnnealingLR(LRScheduler):
    """A cosine from each group's initial rate down to ``eta_min`` over ``T_max`` steps, PyTorch's closed
    form: ``eta_min + (base − eta_min)·(1 + cos(π·t/T_max))/2`` (past ``T_max`` it rises again, as
    PyTorch's). With ``warmup`` steps (a textnet addition, nanoGPT's ``get_lr``): the rate rises as
    ``base·(t + 1)/(warmup + 1)`` for t < warmup, then the cosine runs over ``T_max − warmup`` steps."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1,
                 warmup: int = 0) -> None:
        if not 0 <= warmup < T_max:
            raise ValueError(f"CosineAnnealingLR: warmup must be in 0..T_max ({T_max}), got {warmup}")
        self.T_max, self.eta_min, self.warmup = T_max, eta_min, warmup
        super().__init__(optimizer, last_epoch)

    def rate(self, base_lr: float, step: int, group: int) -> float:
        if step < self.warmup:
            return base_lr * (step + 1) / (self.warmup + 1)
        progress = (step - self.warmup) / (self.T_max - self.warmup)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * progress)) / 2


__all__ = ["CosineAnnealingLR", "LRScheduler", "LambdaLR"]
