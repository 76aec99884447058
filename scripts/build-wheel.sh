#!/usr/bin/env bash
# Builds the Python package's wheel into target/wheels with the GPU kernels of fused/precompiled.txt compiled
# in (TEXTNET_PRECOMPILE=1), so that its first run on a GPU compiles none: `scripts/build-wheel.sh [more
# maturin build flags]`. build.rs then needs NVRTC (docs/gpu.md, "Kernels compiled at build time") and takes
# several minutes; `pip install .` builds without them, as a plain `cargo build` does, and so does this
# script with TEXTNET_PRECOMPILE=0 (scripts/test.sh's quick wheel). The wheel installs without Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v maturin >/dev/null; then
  echo "scripts/build-wheel.sh: needs maturin on PATH (pip install maturin)" >&2
  exit 1
fi
TEXTNET_PRECOMPILE=${TEXTNET_PRECOMPILE:-1} exec maturin build --release "$@"
