"""NVRTC (which compiles the GPU kernels) from the ``nvidia-cuda-nvrtc-cu12`` wheel that ``textnet[cuda]``
installs: its folder is handed to the native module, so nobody sets ``LD_LIBRARY_PATH``."""

import importlib.util
import os

from . import _native


def register_nvrtc() -> None:
    """Hands every ``nvidia/*/lib`` folder of the installed NVIDIA wheels to the native module, which
    loads libnvrtc from there when the system's loader does not find it."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return
    for root in spec.submodule_search_locations:
        for name in ("cuda_nvrtc", "cu13", "cu12"):
            lib = os.path.join(root, name, "lib")
            if os.path.isdir(lib):
                _native.add_nvrtc_dir(lib)
