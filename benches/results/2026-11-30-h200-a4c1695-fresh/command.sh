#!/usr/bin/env bash
# On a freshly started H200 with an empty kernel cache, the build with its kernels compiled in
# (TEXTNET_PRECOMPILE=1): the first `selftest --quick`, then the full selftest, after nn's checks gained
# the implicit conv products and their checks; f3bb81e's capture and tensor-map mends among what it runs.
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at this commit, stripped and
# xz-compressed to data/textnet-pre-a4c1695.xz. OUT set.
set -u
xz -dc data/textnet-pre-a4c1695.xz > /tmp/textnet && chmod +x /tmp/textnet
export TEXTNET_CACHE=/tmp/fresh-cache
rm -rf "$TEXTNET_CACHE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/fresh-gpu.txt"
timed() {  # timed SECONDS COMMAND...: its last lines, exit status and wall seconds
  local s=$(date +%s.%N); timeout "$@" 2>&1 | tail -3; local rc=${PIPESTATUS[0]}
  echo "rc $rc wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" "$s") s"
}
{
  echo "## selftest --quick"; timed 90 bash -c '/tmp/textnet selftest --quick > /tmp/quick.txt; rc=$?; tail -2 /tmp/quick.txt; exit $rc'
  echo "## selftest"; timed 90 bash -c '/tmp/textnet selftest > /tmp/full.txt; rc=$?; tail -2 /tmp/full.txt; exit $rc'
} > "$OUT/first-runs.txt" 2>&1
