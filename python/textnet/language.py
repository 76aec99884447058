"""The language models: the next-token text model (``textnet train``) and the character Transformer
(``textnet transformer``), trained by their commands run in this process and held in memory as their
model files."""

import functools
import os
import tempfile
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native

__all__ = ["TextModel", "Transformer"]

PathLike = Union[str, "os.PathLike[str]"]


def _flags(flags: dict) -> List[str]:
    """Keyword arguments as the command's flags: ``epochs=3`` → ``--epochs 3``, ``quiet=True`` →
    ``--quiet``, False and None left out, a list joined by commas."""
    args: List[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is True:
            args.append(name)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            args += [name, ",".join(str(v) for v in value)]
        else:
            args += [name, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return args


class _LanguageModel:
    _kind = ""
    _command = ""

    def __init__(self, native: "_native.LanguageModel") -> None:
        self._native = native

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Each kind gets its own `train`, whose help names the kind's command where the shared docstring
        # has `{command}`.
        shared = _LanguageModel.train.__func__  # type: ignore[attr-defined]

        @functools.wraps(shared)
        def train(kind: Any, corpus_path: PathLike, **flags: Any) -> Any:
            return shared(kind, corpus_path, **flags)

        train.__doc__ = (shared.__doc__ or "").format(command=cls._command)
        train.__qualname__ = f"{cls.__qualname__}.train"
        cls.train = classmethod(train)  # type: ignore[method-assign,assignment]

    @classmethod
    def load(cls, path: PathLike) -> Any:
        """Reads a model file of this kind. Raises ``FileNotFoundError``, or ``ValueError`` for a file of
        another kind."""
        return cls(_native.LanguageModel.load(os.fspath(path), cls._kind))

    def save(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the model file atomically, as ``Sequential.save`` does: a file there that is not a textnet
        model is refused (``FileExistsError``) unless ``overwrite``, a textnet model of another kind always."""
        self._native.save(os.fspath(path), overwrite)

    @classmethod
    def train(cls, corpus_path: PathLike, **flags: Any) -> Any:
        """Trains on ``corpus_path`` as ``textnet {command} CORPUS --flag value …`` would (every flag of
        ``textnet {command} --help`` as a keyword: ``epochs=3``, ``device="cpu"``, ``quiet=True``), and
        returns the model. Without ``out=`` the model file is written to a temporary folder and removed
        once read; with it, it stays there, and an existing model there is only replaced by a better one,
        as on the command line. Its lines go to stdout and stderr. Ctrl-C stops after the current epoch
        (evaluation), keeps it and raises ``KeyboardInterrupt``."""
        out = flags.pop("out", None)
        with tempfile.TemporaryDirectory(prefix="textnet-") as folder:
            path = os.fspath(out) if out is not None else os.path.join(folder, "model.safetensors")
            args = [os.fspath(corpus_path), "--out", path] + _flags(flags)
            interrupted = _native.run_command(cls._command, args)
            model = cls.load(path) if os.path.exists(path) else None
        if interrupted:
            raise KeyboardInterrupt(f"textnet {cls._command} stopped early" + (f"; {out} holds the kept model" if out else ""))
        if model is None:
            raise RuntimeError(f"textnet {cls._command} wrote no model")
        return model

    def generate(
        self,
        prompt: str = "",
        length: int = 50,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        seed: int = 1,
        stop: Sequence[str] = (),
    ) -> str:
        """A continuation of ``prompt``: ``length`` tokens (characters for a Transformer) drawn at
        ``temperature`` among the ``top_k`` likeliest and the ``top_p`` nucleus, from ``seed``, ending early
        after a ``stop`` string, as ``textnet generate`` does. Returns the generated text without the
        prompt."""
        return self._native.generate(prompt, length, temperature, top_k, top_p, seed, list(stop))


class TextModel(_LanguageModel):
    """The next-token text model of ``textnet train``:

        model = textnet.TextModel.train("corpus/shakespeare.txt", epochs=2)
        model.predict("to be or", top=5)       # [(token, probability), …], likeliest first
        model.generate("to be", length=20)
    """

    _kind = "text"
    _command = "train"

    def predict(self, text: str, top: int = 5) -> List[Tuple[str, float]]:
        """The ``top`` likeliest next tokens after ``text``, as (token, probability) pairs."""
        return self._native.predict(text, top)


class Transformer(_LanguageModel):
    """The character Transformer of ``textnet transformer``:

        model = textnet.Transformer.train("corpus/shakespeare.txt", steps=2000)
        print(model.generate("ROMEO:", length=200, temperature=0.8, top_k=40))
    """

    _kind = "transformer"
    _command = "transformer"

    def encode(self, text: str) -> List[int]:
        """The ids of ``text``'s characters in the model's vocabulary (an unknown character is id 0)."""
        return self._native.encode(text)

    def logits(self, ids: Sequence[int]) -> "np.ndarray":
        """The scores for the next character after each position of ``ids`` (1 to ``block`` ids), float32
        of shape ``(len(ids), vocab)``, dropout off: what ``export_onnx``'s graph gives for one sequence."""
        return self._native.logits([int(i) for i in ids])

    def export_onnx(self, path: PathLike) -> None:
        """Writes the model as an ONNX file (operator set 17), as ``textnet export --onnx`` does: input
        ``input_ids`` (int64, ``[batch, sequence]``), output ``logits`` (``[batch, sequence, vocab]``);
        the vocabulary is in its metadata. See docs/onnx.md."""
        self._native.export_onnx(os.fspath(path))
