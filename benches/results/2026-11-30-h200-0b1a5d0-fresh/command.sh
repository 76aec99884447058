#!/usr/bin/env bash
# On a freshly started H200, built with its kernels compiled in (TEXTNET_PRECOMPILE=1), an empty kernel
# cache: the first `selftest --quick`, then the full selftest; then scripts/device-check.sh's `transformer`
# and `fit` modes (each bench beside its baseline) with the same binary.
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at 0b1a5d0, stripped, xz'd to data/textnet-head.xz.
# Fashion-MNIST's four files xz'd in data/fmnist-xz. Run from the repository root with OUT set.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-head.xz > /tmp/textnet && chmod +x /tmp/textnet
timed() {  # timed SECONDS COMMAND...: its last lines, exit status and wall seconds
  local s=$(date +%s.%N); timeout "$@" 2>&1 | tail -3; local rc=${PIPESTATUS[0]}
  echo "rc $rc wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" "$s") s"
}
{
  export TEXTNET_CACHE=/tmp/fresh-cache
  rm -rf "$TEXTNET_CACHE"
  echo "## selftest --quick"; timed 90 bash -c '/tmp/textnet selftest --quick > /tmp/quick.txt; rc=$?; tail -2 /tmp/quick.txt; exit $rc'
  grep FAIL /tmp/quick.txt | cut -c1-250 | head -5
  echo "## selftest"; timed 120 bash -c '/tmp/textnet selftest > /tmp/full.txt; rc=$?; tail -2 /tmp/full.txt; exit $rc'
  grep FAIL /tmp/full.txt | cut -c1-250 | head -5
} > "$OUT/first-runs.txt" 2>&1
cat "$OUT/first-runs.txt"
mkdir -p data/fashion-mnist target/release
for f in data/fmnist-xz/*.xz; do xz -dc "$f" > "data/fashion-mnist/$(basename "$f" .xz)"; done
cp /tmp/textnet target/release/textnet
{ OUT=$OUT/device-check timeout 300 bash scripts/device-check.sh transformer fit; echo "rc $?"; } > "$OUT/device-check.txt" 2>&1
tail -40 "$OUT/device-check.txt" | cut -c1-400
