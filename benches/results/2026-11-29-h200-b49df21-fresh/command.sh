#!/usr/bin/env bash
# On a freshly started H200, the build with its kernels compiled in (TEXTNET_PRECOMPILE=1: every module of
# fused/precompiled.txt, the selftest's fit specs among them), an empty kernel cache: the first `selftest
# --quick`, then the full selftest, then a `fit` spec not seen before (-v; Fashion-MNIST's test split as
# both splits, to carry less). Then the fused linear + cross-entropy kernel's two mutations
# (scripts/mutants.py); nn's MLP step (bench nn) beside bench fit; the same MLP from Python
# (scripts/nn_mlp_python.py) and where its time goes (python_overhead.py); Keras's mnist_convnet on the
# host's CPU beside PyTorch's (scripts/convnet_cpu_compare.sh).
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at this commit (NVRTC 12.9 wheel at
# build time), stripped and gzipped to data/; the wheel (`TEXTNET_PRECOMPILE=0 maturin build --release`)
# in data/wheels; data/fashion-small: Fashion-MNIST's t10k files, also as train-*. OUT set.
set -u
here=benches/results/2026-11-29-h200-b49df21-fresh
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
    --data data/fashion-small --epochs 1 --device cuda -v --out /tmp/fit-new 2>&1 | grep -iE "compil|ready|epoch|setup"'
} > "$OUT/first-runs.txt" 2>&1
grep -E "fused|checks,|FAIL" /tmp/full.txt | cut -c1-200 > "$OUT/checks.txt"
timeout 200 python3 scripts/mutants.py --bin /tmp/textnet --jobs 3 --seed 7 "fused linear + cross-entropy" > "$OUT/mutants.txt" 2>&1
pip install -q --no-deps --target /tmp/py data/wheels/*.whl 2>/dev/null
{
  timeout 60 /tmp/textnet bench nn --repeats 5 | sed -n 1,12p
  timeout 60 /tmp/textnet bench fit --repeats 5 --json | python3 -c "import json,sys; d=json.load(sys.stdin); print('bench fit us_per_step', d['us_per_step'], d['launches'])"
  TEXTNET_NO_PDL=1 timeout 60 /tmp/textnet bench nn --repeats 5 | sed -n 8,11p | sed 's/^/no PDL: /'
  PYTHONPATH=/tmp/py timeout 90 python3 scripts/nn_mlp_python.py
  PYTHONPATH=/tmp/py timeout 90 python3 $here/python_overhead.py
} > "$OUT/mlp.txt" 2>&1
PYTHON=python3 PYTHONPATH=/tmp/py THREADS=$(nproc) timeout 200 bash scripts/convnet_cpu_compare.sh > "$OUT/convnet-cpu.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/convnet-cpu.txt"
