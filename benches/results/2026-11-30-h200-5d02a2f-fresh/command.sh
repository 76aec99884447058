#!/usr/bin/env bash
# One run on a freshly started H200: 5d02a2f (a new fit spec starts on the generic dense kernels, d2184f5; its module loads no longer wait on a compile, 5d02a2f) beside
# eba847d (before it), both built with their kernels compiled in (TEXTNET_PRECOMPILE=1).
# 1. 5d02a2f, an empty kernel cache: the first `selftest --quick`, then the full selftest; its generic checks.
# 2. `fit` on a spec not seen before (Linear(784, 96), Tanh, Linear(96, 10), Fashion-MNIST, -v), each build
#    with an empty cache of its own: 1 epoch, then 30 epochs (where 5d02a2f swaps its own kernels in); the
#    model files' hashes, which must match between the builds.
# 3. `bench fit` of each build, alternating.
# 4. The mutations of the dense kernels' code d2184f5 changed (scripts/mutants.py).
# Binaries: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at each commit, stripped, xz'd to
# data/textnet-new.xz (5d02a2f) and data/textnet-fresh.xz (eba847d). Fashion-MNIST's four files xz'd in
# data/fmnist-xz. OUT set.
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p data/fashion-mnist; for f in data/fmnist-xz/*.xz; do xz -dc "$f" > "data/fashion-mnist/$(basename "$f" .xz)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-new.xz > /tmp/textnet-new && chmod +x /tmp/textnet-new
xz -dc data/textnet-fresh.xz > /tmp/textnet-base && chmod +x /tmp/textnet-base
timed() {  # timed SECONDS COMMAND...: its last lines, exit status and wall seconds
  local s=$(date +%s.%N); timeout "$@" 2>&1 | tail -24; local rc=${PIPESTATUS[0]}
  echo "rc $rc wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 2))" "$s") s"
}
{
  export TEXTNET_CACHE=/tmp/cache-selftest; rm -rf $TEXTNET_CACHE
  echo "## selftest --quick"; timed 90 bash -c '/tmp/textnet-new selftest --quick > /tmp/quick.txt; rc=$?; tail -2 /tmp/quick.txt; exit $rc'
  grep FAIL /tmp/quick.txt | cut -c1-250 | head -5
  echo "## selftest"; timed 120 bash -c '/tmp/textnet-new selftest > /tmp/full.txt; rc=$?; tail -2 /tmp/full.txt; exit $rc'
  grep FAIL /tmp/full.txt | cut -c1-250 | head -5
  unset TEXTNET_CACHE
} > "$OUT/first-runs.txt" 2>&1
grep -E "generic dense" /tmp/full.txt | cut -c1-200 > "$OUT/generic-checks.txt"
spec="Linear(784, 96), Tanh, Linear(96, 10)"
fit() {  # fit BINARY CACHE EPOCHS MODEL
  TEXTNET_CACHE=$2 timed 60 bash -c "$1 fit --layers '$spec' --dataset fashion --data data/fashion-mnist --epochs $3 \
    --device cuda -v --out $4 2>&1 | grep -iE 'compil|generic|own kernels|epoch (1|2|3|10|20|30)/|holds'"
}
{
  rm -rf /tmp/cb1 /tmp/cn1 /tmp/cb30 /tmp/cn30
  echo "## eba847d, 1 epoch"; fit /tmp/textnet-base /tmp/cb1 1 /tmp/b1.safetensors
  echo "## 5d02a2f, 1 epoch"; fit /tmp/textnet-new /tmp/cn1 1 /tmp/n1.safetensors
  echo "## eba847d, 30 epochs"; fit /tmp/textnet-base /tmp/cb30 30 /tmp/b30.safetensors
  echo "## 5d02a2f, 30 epochs"; fit /tmp/textnet-new /tmp/cn30 30 /tmp/n30.safetensors
  echo "## model files"; sha256sum /tmp/b1.safetensors /tmp/n1.safetensors /tmp/b30.safetensors /tmp/n30.safetensors
} > "$OUT/new-spec.txt" 2>&1
{
  for round in 1 2; do
    for b in base new; do echo "## $b"; timeout 60 /tmp/textnet-$b bench fit --repeats 5 2>&1 | tail -4; done
  done
} > "$OUT/bench-fit.txt" 2>&1
cat "$OUT/first-runs.txt" "$OUT/generic-checks.txt" "$OUT/new-spec.txt" "$OUT/bench-fit.txt"
timeout 200 python3 scripts/mutants.py --bin /tmp/textnet-new --jobs 4 "dense backward (fit)" "first sample's (fit)" \
  "generic dense" > "$OUT/mutants.txt" 2>&1
cut -c1-300 "$OUT/mutants.txt" | tail -7
