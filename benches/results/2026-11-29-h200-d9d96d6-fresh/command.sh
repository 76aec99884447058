#!/usr/bin/env bash
# The first runs on a freshly started H200 with an empty kernel cache (the default build compiles its
# kernels on first use): `selftest --quick`, then the full selftest, then a `fit` spec not seen before.
# Binary: `TEXTNET_PRECOMPILE=0 cargo build --release --bin textnet` at this commit, stripped and gzipped to
# data/; Fashion-MNIST in data/. OUT set.
set -u
gunzip -c data/textnet.gz > /tmp/textnet && chmod +x /tmp/textnet
export TEXTNET_CACHE=/tmp/fresh-cache NCCL_NVLS_ENABLE=0
rm -rf "$TEXTNET_CACHE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
{ S=$(date +%s.%N); timeout 170 /tmp/textnet selftest --quick | tail -2; echo "rc ${PIPESTATUS[0]} wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" $S) s"; } > "$OUT/first-runs.txt" 2>&1
{ S=$(date +%s.%N); timeout 80 /tmp/textnet selftest | tail -2; echo "rc ${PIPESTATUS[0]} wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" $S) s"; } >> "$OUT/first-runs.txt" 2>&1
{ S=$(date +%s.%N); timeout 40 /tmp/textnet fit --layers "Linear(784, 96), Tanh, Linear(96, 10)" --data data/fashion-mnist --epochs 1 --device cuda -v 2>&1 | grep -iE "compil|epoch|setup" | tail -6; echo "rc ${PIPESTATUS[0]} wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" $S) s"; } >> "$OUT/first-runs.txt" 2>&1
