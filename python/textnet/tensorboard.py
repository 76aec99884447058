"""``textnet.tensorboard``: TensorBoard event files from Python, as ``torch.utils.tensorboard`` writes
them, so that a training loop of one's own (or ``Sequential.fit(tensorboard_dir=...)``) can be watched
with ``tensorboard --logdir DIR``.

    from textnet.tensorboard import SummaryWriter
    with SummaryWriter("runs/exp1") as writer:
        for step in range(100):
            writer.add_scalar("loss/train", loss, step)
        writer.add_hparams({"lr": 0.01, "batch": 64}, {"hparam/loss": loss})

The files are written by textnet's own writer (the one behind ``textnet ... --tensorboard DIR``); each
event is on disk as soon as it is added.
"""

import json
import os
import socket
import time
from datetime import datetime
from typing import Any, Dict, Optional

from . import _native

__all__ = ["SummaryWriter"]


def _number(value: Any, what: str) -> float:
    """A plain float of a Python or NumPy number (or a one-element array or tensor)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


class SummaryWriter:
    """Writes an event file in ``log_dir`` (created if missing; default ``runs/<date>_<host>``, as
    PyTorch's). ``add_scalar(tag, value, global_step)`` adds a point to a curve, ``add_hparams`` the
    run's hyperparameters for TensorBoard's HParams dashboard. A ``log_dir`` that is a file or cannot be
    created raises ``OSError``."""

    def __init__(self, log_dir: Any = None, comment: str = "") -> None:
        if log_dir is None:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = os.fspath(log_dir)
        self._writer = _native.EventWriter(self.log_dir)

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Optional[int] = None) -> None:
        """The value of curve ``tag`` at step ``global_step`` (0 when None)."""
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, got {tag!r}")
        step = 0 if global_step is None else int(global_step)
        self._writer.scalars(step, [(tag, _number(scalar_value, "scalar_value"))])

    def add_scalars(self, values: Dict[str, Any], global_step: Optional[int] = None) -> None:
        """Several curves at one step, in one event: ``{tag: value}``."""
        step = 0 if global_step is None else int(global_step)
        self._writer.scalars(step, [(str(tag), _number(v, f"the value of {tag}")) for tag, v in values.items()])

    def add_hparams(
        self,
        hparam_dict: Dict[str, Any],
        metric_dict: Dict[str, Any],
        run_name: Optional[str] = None,
        global_step: Optional[int] = None,
    ) -> None:
        """As PyTorch's ``add_hparams``: a run of its own, ``log_dir/run_name`` (default the time), holding
        the hyperparameters (numbers, strings, booleans; None left out) and the metrics, each a scalar
        that the HParams dashboard shows beside them."""
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError("hparam_dict and metric_dict must be dicts")
        for key, value in hparam_dict.items():
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise TypeError(f"hparam {key!r} must be a number, string, bool or None, got {value!r}")
        metrics = {str(k): _number(v, f"metric {k!r}") for k, v in metric_dict.items()}
        run = SummaryWriter(os.path.join(self.log_dir, run_name or str(time.time())))
        try:
            run._hparams(hparam_dict, list(metrics))
            run.add_scalars(metrics, global_step)
        finally:
            run.close()

    def _hparams(self, hparam_dict: Dict[str, Any], metrics: list, success: bool = True) -> None:
        """The HParams plugin's summaries in this writer's own file (``fit(tensorboard_dir=...)``'s run)."""
        self._writer.hparams(json.dumps(hparam_dict), [str(m) for m in metrics], success)

    @property
    def file(self) -> Optional[str]:
        """The event file (None once closed)."""
        path = self._writer.path
        return None if path is None else os.fspath(path)

    def flush(self) -> None:
        """Nothing to do: every event is on disk when added (PyTorch's name, kept)."""

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
