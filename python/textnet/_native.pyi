"""Type stubs of the native module (python/src/lib.rs). The public API is in ``textnet`` itself."""

from os import PathLike
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

_Path = Union[str, PathLike]

class Model:
    def __init__(
        self,
        spec: str,
        input_shape: Sequence[int],
        loss: str = "ce",
        init: str = "pytorch",
        seed: int = 1,
        class_names: Optional[Sequence[str]] = None,
    ) -> None: ...
    @staticmethod
    def load(path: _Path) -> "Model": ...
    def save(self, path: _Path, overwrite: bool = False) -> None: ...
    @property
    def spec(self) -> str: ...
    @property
    def input_shape(self) -> List[int]: ...
    @property
    def outputs(self) -> int: ...
    @property
    def loss(self) -> str: ...
    @property
    def param_count(self) -> int: ...
    @property
    def class_names(self) -> Optional[List[str]]: ...
    @class_names.setter
    def class_names(self, names: Sequence[str]) -> None: ...
    @property
    def target_scale(self) -> Optional[Tuple[float, float]]: ...
    @property
    def input_kind(self) -> str: ...
    def state_dict(self) -> List[Tuple[str, np.ndarray]]: ...
    def load_state_dict(self, tensors: Sequence[Tuple[str, np.ndarray]]) -> None: ...
    def forward(self, x: np.ndarray, device: str = "auto", batch: int = 1024) -> np.ndarray: ...
    def evaluate(self, x: np.ndarray, y: np.ndarray, device: str = "auto", batch: int = 1024) -> Dict[str, float]: ...
    def fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        x_val: Optional[np.ndarray] = None,
        y_val: Optional[np.ndarray] = None,
        validation_split: Optional[float] = None,
        epochs: int = 10,
        batch_size: int = 64,
        optimizer: str = "adam",
        lr: Optional[float] = None,
        momentum: Optional[float] = None,
        weight_decay: float = 0.0,
        clip_norm: float = 0.0,
        device: str = "auto",
        seed: int = 1,
        lr_schedule: str = "constant",
        warmup: int = 0,
        min_lr: float = 0.0,
        patience: Optional[int] = None,
        on_progress: Optional[Callable[[int, int, int], None]] = None,
        on_epoch: Optional[Callable[[int, Dict[str, float]], None]] = None,
    ) -> Dict[str, object]: ...

class LanguageModel:
    kind: str
    @staticmethod
    def load(path: _Path, kind: str) -> "LanguageModel": ...
    def save(self, path: _Path, overwrite: bool = False) -> None: ...
    def predict(self, text: str, top: int = 5) -> List[Tuple[str, float]]: ...
    def generate(
        self,
        prompt: str = "",
        length: int = 50,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        seed: int = 1,
        stop: Sequence[str] = ...,
    ) -> str: ...

def mnist(
    kind: str = "digits", path: Optional[_Path] = None
) -> Tuple[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]: ...
def mnist_class_names(kind: str) -> List[str]: ...
def selftest(quick: bool = False, only: Optional[Sequence[str]] = None, seed: Optional[int] = None) -> List[dict]: ...
def run_command(name: str, args: Sequence[str]) -> bool: ...
def add_nvrtc_dir(dir: _Path) -> None: ...
def parse_spec(text: str) -> None: ...
def file_kind(path: _Path) -> Optional[str]: ...
