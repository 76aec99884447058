#!/usr/bin/env bash
# Installs what the tests need on a machine with Rust and Python, then runs them: `scripts/test.sh`.
#   - NVRTC, to compile every fused/*.cu (no GPU or driver needed): a CUDA toolkit's libnvrtc when the
#     loader finds one, else the `nvidia-cuda-nvrtc-cu12` wheel, installed into a virtual environment
#     under target/ (never into the user's Python);
#   - Fashion-MNIST for the MNIST tests (Debian/Ubuntu package `dataset-fashion-mnist`), asking first
#     when that needs sudo on a terminal.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh --test it cli_text`); without them the docs are
# built too, warnings counting as errors, and then the Python package:
#   - its wheel is built (scripts/build-wheel.sh, TEXTNET_PRECOMPILE=0 unless set: no kernels compiled in)
#     and installed into target/test-venv with the test extra (pytest, safetensors, matplotlib, tqdm; no
#     PyTorch: the interop tests then compare with a NumPy reference), and its pytest suite (tests/python)
#     run. TEXTNET_TEST_TORCH=1 also installs PyTorch's CPU build for the full interop run;
#   - the same wheel is installed into a fresh virtual environment with no cargo on PATH, where
#     examples/mnist_gpu.py trains at a small size on the CPU: the wheel needs no Rust.
# Tests that need a GPU are ignored here; run them on a GPU machine with `cargo test --release -- --ignored`.
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

pip_quiet() { "$1/bin/python" -m pip install --quiet --disable-pip-version-check "${@:2}"; }

# The Python package: its wheel, its tests in target/test-venv, then the wheel alone in a fresh
# environment without Rust.
python_package() {
  local venv=target/test-venv
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  echo "+ pip install maturin, then scripts/build-wheel.sh (TEXTNET_PRECOMPILE=${TEXTNET_PRECOMPILE:-0})"
  pip_quiet "$venv" "maturin>=1.7,<2" || return 1
  rm -rf target/test-wheels
  PATH="$PWD/$venv/bin:$PATH" TEXTNET_PRECOMPILE=${TEXTNET_PRECOMPILE:-0} \
    scripts/build-wheel.sh --quiet --out target/test-wheels || return 1
  local wheel
  wheel=$(ls target/test-wheels/textnet-*.whl)
  echo "+ the wheel: $wheel, $(du -k "$wheel" | cut -f1) kB"

  echo "+ pip install the wheel with its test extra into $venv, then pytest tests/python"
  pip_quiet "$venv" --force-reinstall --no-deps "$wheel" || return 1
  pip_quiet "$venv" "$wheel[test]" || return 1
  if [ "${TEXTNET_TEST_TORCH:-0}" = 1 ]; then
    echo "+ TEXTNET_TEST_TORCH=1: pip install torch (the CPU build, from download.pytorch.org)"
    pip_quiet "$venv" torch --index-url https://download.pytorch.org/whl/cpu || {
      echo "+ PyTorch's CPU build could not be installed from download.pytorch.org" >&2
      return 1
    }
  fi
  echo "+ $venv: $(du -sm "$venv" | cut -f1) MB"
  TEXTNET_BIN=target/release/textnet "$venv/bin/python" -m pytest -q tests/python || return 1

  # No cargo, rustc or rustup on PATH, no variable of theirs: only what the wheel brings.
  local bare_path
  bare_path=$(tr : '\n' <<<"$PATH" | grep -v -e cargo -e rustup | paste -sd: -)
  local bare=(env -i HOME="$HOME" PATH="$bare_path" LANG=C.UTF-8)
  if "${bare[@]}" bash -c 'command -v cargo || command -v rustc'; then
    echo "+ cannot take cargo off PATH for the wheel's check" >&2
    return 1
  fi
  venv=target/wheel-venv
  echo "+ the wheel alone, into a fresh $venv without cargo on PATH: examples/mnist_gpu.py --device cpu"
  rm -rf "$venv"
  "${bare[@]}" python3 -m venv "$venv" || return 1
  "${bare[@]}" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" || return 1
  "${bare[@]}" "$venv/bin/python" examples/mnist_gpu.py --device cpu --dataset fashion --epochs 1 \
    --train-limit 6000
}

echo "+ cargo test --release --no-fail-fast $*"
status=0
cargo test --release --no-fail-fast "$@" || status=$?
if [ $# -eq 0 ]; then
  echo "+ cargo doc --no-deps (warnings are errors)"
  # The docs need no compiled kernels: TEXTNET_PRECOMPILE=0 spares cargo doc's own run of build.rs.
  TEXTNET_PRECOMPILE=0 RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet || status=1
  python_package || status=1
fi
exit $status
