"""``textnet.compile``: a training step (forward, loss, backward, optimizer step) captured as a CUDA graph
on its first calls and replayed after, as ``torch.compile(mode="reduce-overhead")`` or tinygrad's
``TinyJit``. Capture is a GPU feature: on the CPU a compiled step is the function, called each time.
"""

import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _native, optim
from ._tensor import Tensor


class _Captured:
    """One capture: the step's own input tensors on the GPU, refilled from each call's, and its graph."""

    def __init__(self, given: List[Tensor]) -> None:
        self.inputs = [Tensor(t.numpy(), device="cuda") for t in given]
        self.step = _native.CapturedStep(self.inputs)


class CompiledStep:
    """A step made by ``textnet.compile``; call it as the function.

    On the GPU (some argument a tensor on "cuda") the first two calls run the function op by op, the
    third records its launches as one CUDA graph, and every later call replays the graph without calling
    the function. The graph's kernels read each call's tensor arguments where they are (no copy; the
    graph's own input tensors stand for them only in the calls that run the function, and where a graph
    touches an input otherwise than through a kernel's argument, the arguments are copied into them). So:

    - the function returns the loss (a float32 tensor), and a replay returns the same tensor each time,
      holding that step's value (read it with ``.item()`` when wanted: that waits for the GPU);
    - what the function reads besides its tensor arguments (parameters, optimizer state, the optimizers'
      ``lr``, which is pushed to the GPU before each call) must live on the GPU or be a constant: other
      arguments (numbers, strings) are constants of the graph, and a new value captures the step again,
      as a new shape or dtype of a tensor argument does, or a change of ``textnet.set_precision``;
    - a step that copies between host and GPU inside (``.item()``, ``.numpy()``, a tensor made from
      NumPy) cannot be captured: it runs op by op, which is said once;
    - ``nn.Dropout`` draws a new mask at each replay (its step counter lives on the GPU), where
      ``F.dropout``'s mask is drawn on the host and replays as recorded.

    ``fusions()`` lists the fusions the last capture made (name, count), as the engine's
    ``CapturedStep::fusions``.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        functools.update_wrapper(self, function)
        self._function = function
        self._captured: Dict[Tuple[Any, ...], _Captured] = {}
        self._last: Optional[_Captured] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Called once a step, so kept lean: a replayed step of a small model takes about 20 µs of GPU time.
        given = [a for a in args if isinstance(a, Tensor)]
        if kwargs:
            given += [v for v in kwargs.values() if isinstance(v, Tensor)]
        devices = [t.device for t in given]
        if "cuda" not in devices:
            return self._function(*args, **kwargs)
        if optim._push_rates():
            # A group's rate changed apart from the others': the graphs keep the old proportions.
            self._captured.clear()
        signature = (
            _native.precision(),
            tuple((t.shape, t.dtype) for t in given),
            tuple(repr(a) for a in args if not isinstance(a, Tensor)) if len(given) != len(args) else (),
            tuple((k, repr(v)) for k, v in sorted(kwargs.items()) if not isinstance(v, Tensor)) if kwargs else (),
        )
        captured = self._captured.get(signature)
        fresh = captured is None
        if fresh:
            captured = self._captured[signature] = _Captured(given)
        self._last = captured

        def step() -> Any:
            statics = iter(captured.inputs)
            static_args = tuple(next(statics) if isinstance(a, Tensor) else a for a in args)
            static_kwargs = {k: next(statics) if isinstance(v, Tensor) else v for k, v in kwargs.items()}
            return self._function(*static_args, **static_kwargs)

        if fresh:
            return captured.step.run(step)
        if "cpu" not in devices:
            return captured.step.run_refilled(given, step)
        for mine, theirs in zip(captured.inputs, given):
            mine.copy_(theirs)
        return captured.step.run(step)

    def fusions(self) -> "list[tuple[str, int]]":
        """The fusions the last capture made, each with how many times: empty before a capture, on the
        CPU, or when nothing fused."""
        return self._last.step.fusions() if self._last is not None else []

    def captures(self) -> int:
        """How many times the step was captured, over every shape of its inputs."""
        return sum(captured.step.captures() for captured in self._captured.values())


def compile(function: Optional[Callable[..., Any]] = None) -> Any:  # noqa: A001 (torch's name)
    """The training step ``function`` captured as a CUDA graph on the GPU (see ``CompiledStep``); on the
    CPU, ``function`` itself, called each time (capture is a GPU feature). Use it as
    ``step = textnet.compile(train_step)`` or as the decorator ``@textnet.compile``."""
    if function is None:
        return compile
    return CompiledStep(function)
