#!/usr/bin/env bash
# Builds the Python package's wheel into target/wheels with the GPU kernels of fused/precompiled.txt compiled
# in (TEXTNET_PRECOMPILE=1), so that its first run on a GPU compiles none: `scripts/build-wheel.sh [more
# maturin build flags]`. build.rs then needs NVRTC (README, "Kernels compiled at build time") and takes a few
# minutes; `pip install .` builds without them, as a plain `cargo build` does.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v maturin >/dev/null; then
  echo "scripts/build-wheel.sh: needs maturin on PATH (pip install maturin)" >&2
  exit 1
fi
TEXTNET_PRECOMPILE=1 exec maturin build --release "$@"
