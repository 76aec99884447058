#!/usr/bin/env bash
# On a freshly started H200, the build with its kernels compiled in (TEXTNET_PRECOMPILE=1, every module of
# fused/precompiled.txt, the selftest's fit specs among them), an empty kernel cache: the first `selftest
# --quick`, then the full selftest, then a `fit` spec not seen before (-v). Then nn's MLP step (bench nn)
# beside bench fit, a kernel-by-kernel sample of both (ncu), and the new fused kernel's two mutations
# (scripts/mutants.py, on this commit's fused/, carried as data/fused-afda360).
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at this commit (NVRTC 12.9 wheel at
# build time), stripped and gzipped to data/; Fashion-MNIST in data/. OUT set.
set -u
gunzip -c data/textnet.gz > /tmp/textnet && chmod +x /tmp/textnet
export TEXTNET_CACHE=/tmp/fresh-cache NCCL_NVLS_ENABLE=0
rm -rf "$TEXTNET_CACHE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timed() {  # timed SECONDS COMMAND...: its last lines, exit status and wall seconds
  local s=$(date +%s.%N); timeout "$@" 2>&1 | tail -8; local rc=${PIPESTATUS[0]}
  echo "rc $rc wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" "$s") s"
}
{
  echo "## selftest --quick"; timed 90 bash -c '/tmp/textnet selftest --quick > /tmp/quick.txt; rc=$?; tail -2 /tmp/quick.txt; exit $rc'
  echo "## selftest"; timed 90 bash -c '/tmp/textnet selftest --seed 7 > /tmp/full.txt; rc=$?; tail -2 /tmp/full.txt; exit $rc'
  echo "## fit, a new spec"
  timed 60 bash -c '/tmp/textnet fit --layers "Linear(784, 96), Tanh, Linear(96, 10)" --dataset fashion \
    --data data/fashion-mnist --epochs 1 --device cuda -v --out /tmp/fit-new 2>&1 | grep -iE "compil|ready|epoch|setup"'
} > "$OUT/first-runs.txt" 2>&1
grep -E "fused|checks," /tmp/full.txt | cut -c1-200 > "$OUT/checks.txt"
timeout 200 python3 scripts/mutants.py --bin /tmp/textnet --fused data/fused-afda360/fused --jobs 3 --seed 7 "fused linear + cross-entropy" > "$OUT/mutants.txt" 2>&1
{
  timeout 60 /tmp/textnet bench nn --repeats 5 | sed -n 1,12p
  timeout 60 /tmp/textnet bench fit --repeats 5 --json | python3 -c "import json,sys; d=json.load(sys.stdin); print('bench fit us_per_step', d['us_per_step'], d['launches'])"
} > "$OUT/mlp.txt" 2>&1
# ncu: every kernel of 5 steps of each nn workload, and 120 kernels from the middle of bench fit's first epoch
ncu_rows() { grep '^"' | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin)); head = rows[0]; name, grid, value = head.index('Kernel Name'), head.index('Grid Size'), head.index('Metric Value')
for r in rows[1:]: print(r[name][:60], r[grid], r[value].replace(',', ''), sep='\t')"; }
{
  echo "## bench nn --steps 5"; timeout 150 ncu --metrics gpu__time_duration.sum --csv /tmp/textnet bench nn --steps 5 --repeats 1 --ops 1 2>/dev/null | ncu_rows
  echo "## bench fit"; timeout 100 ncu --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 120 /tmp/textnet bench fit --repeats 1 --epochs 1 2>/dev/null | ncu_rows
} > "$OUT/ncu.txt" 2>&1
