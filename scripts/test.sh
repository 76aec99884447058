#!/usr/bin/env bash
# Installs what the tests need on a machine with Rust and Python, then runs them: `scripts/test.sh`.
#   - NVRTC, to compile every fused/*.cu (no GPU or driver needed): a CUDA toolkit's libnvrtc when the
#     loader finds one, else the `nvidia-cuda-nvrtc-cu12` wheel (into a virtual environment under
#     target/ where pip may not install for the user);
#   - Fashion-MNIST for the MNIST tests (Debian/Ubuntu package `dataset-fashion-mnist`).
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh --test it cli_text`); without them the docs are
# built too, warnings counting as errors. Tests that need a GPU are
# ignored here; run them on a GPU machine with `cargo test --release -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_lib() {
  "$1" -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null
}
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  lib=$(nvrtc_lib python3 || true)
  if [ -z "$lib" ]; then
    echo "+ installing NVRTC (pip: nvidia-cuda-nvrtc-cu12)"
    if python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc-cu12 2>/dev/null; then
      lib=$(nvrtc_lib python3)
    else
      venv=target/test-venv
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc-cu12
      lib=$(nvrtc_lib "$venv/bin/python")
    fi
  fi
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  echo "+ installing Fashion-MNIST (apt: dataset-fashion-mnist)"
  sudo=$([ "$(id -u)" != 0 ] && command -v sudo || true)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist
fi

echo "+ cargo test --release --no-fail-fast $*"
status=0
cargo test --release --no-fail-fast "$@" || status=$?
if [ $# -eq 0 ]; then
  echo "+ cargo doc --no-deps (warnings are errors)"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet || status=1
fi
exit $status
