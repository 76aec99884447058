#!/usr/bin/env bash
# Installs what the tests need on a machine with Rust and Python, then runs them: `scripts/test.sh`.
#   - NVRTC, to compile every fused/*.cu (no GPU or driver needed): a CUDA toolkit's libnvrtc when the
#     loader finds one, else the `nvidia-cuda-nvrtc-cu12` wheel, installed into a virtual environment
#     under target/ (never into the user's Python);
#   - Fashion-MNIST for the MNIST tests (Debian/Ubuntu package `dataset-fashion-mnist`), asking first
#     when that needs sudo on a terminal.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh --test it cli_text`); without them the docs are
# built too, warnings counting as errors, and the Python package is built and installed into a virtual
# environment under target/ (`pip install ".[cuda,test]"`) and its pytest suite (tests/python) run. Tests that need a GPU are
# ignored here; run them on a GPU machine with `cargo test --release -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_lib() {
  "$1" -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null
}
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  # NVRTC from the wheel: one the user's Python already has, else into a virtual environment of our own
  # under target/ (never into the user's Python).
  lib=$(nvrtc_lib python3 || true)
  if [ -z "$lib" ]; then
    venv=target/test-venv
    lib=$(nvrtc_lib "$venv/bin/python" || true)
    if [ -z "$lib" ]; then
      echo "+ installing NVRTC into $venv (pip: nvidia-cuda-nvrtc-cu12)"
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc-cu12
      lib=$(nvrtc_lib "$venv/bin/python")
    fi
  fi
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  sudo=$([ "$(id -u)" != 0 ] && command -v sudo || true)
  if [ -n "$sudo" ] && [ -t 0 ]; then
    read -r -p "The MNIST tests need Fashion-MNIST: install it with sudo apt-get install dataset-fashion-mnist? [y/N] " yes
    case $yes in [yY]*) ;; *) sudo=skip ;; esac
  fi
  if [ "$sudo" = skip ]; then
    echo "+ Fashion-MNIST not installed: the tests that read it will fail"
  else
    echo "+ installing Fashion-MNIST (apt: dataset-fashion-mnist)"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist
  fi
fi

echo "+ cargo test --release --no-fail-fast $*"
status=0
cargo test --release --no-fail-fast "$@" || status=$?
if [ $# -eq 0 ]; then
  echo "+ cargo doc --no-deps (warnings are errors)"
  # The docs need no compiled kernels: TEXTNET_PRECOMPILE=0 spares cargo doc's own run of build.rs.
  TEXTNET_PRECOMPILE=0 RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet || status=1
  # The package's own environment, never the user's Python; pip builds it with maturin (from PyPI).
  venv=target/test-venv
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  echo "+ pip install \".[cuda,test]\" into $venv, then pytest tests/python"
  if "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ".[cuda,test]"; then
    TEXTNET_BIN=target/release/textnet "$venv/bin/python" -m pytest -q tests/python || status=1
  else
    status=1
  fi
fi
exit $status
