#!/usr/bin/env bash
# On a freshly started H200, built with its kernels compiled in (TEXTNET_PRECOMPILE=1), an empty kernel
# cache: the first `selftest --quick`, then the full selftest; then the same model bytes as 4491aba's build
# (data/textnet-wgmma.xz) for a Transformer run with dropout, fp32 and bf16. Run from the repository root with OUT set.
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at b700823, stripped, xz'd to data/textnet-head.xz;
# 4491aba's `cargo build --release --bin textnet` in data/textnet-wgmma.xz. same-bytes.txt: the SHA-256 of both
# builds' model files, fp32 then bf16 (2 = the same bytes).
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
xz -dc data/textnet-wgmma.xz > /tmp/before && chmod +x /tmp/before
train() { timeout 120 "$1" transformer corpus/tinyshakespeare.txt --layers 2 --heads 4 --embed 128 --block 64 --batch 16 \
  --dropout 0.2 --steps 60 --eval-every 30 --eval-iters 5 --seed 3 --precision "$2" --out "/tmp/$3.safetensors" --overwrite --quiet; }
{ for p in fp32 bf16; do train /tmp/textnet $p after-$p; train /tmp/before $p before-$p
    sha256sum /tmp/before-$p.safetensors /tmp/after-$p.safetensors | awk '{print $1}' | uniq -c; done; } > "$OUT/same-bytes.txt" 2>&1
cat "$OUT/same-bytes.txt"
