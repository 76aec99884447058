#!/usr/bin/env bash
# One run on a freshly started H200 (its first-selftest timing is superseded by 2026-12-01-h200-def7ffd-fresh):
# the first selftest of eaaf6bc's build (kernels built in, an empty kernel
# cache), --quick then the whole; then `bench nn` (eager ops and the MLP's captured step) beside b700823's build.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-fuse.xz > /tmp/new && chmod +x /tmp/new
xz -dc data/textnet-head.xz > /tmp/old && chmod +x /tmp/old
{
  export TEXTNET_CACHE=$(mktemp -d)
  for args in "--quick" ""; do
    s=$(date +%s%N); /tmp/new selftest $args > /tmp/st.txt 2>&1; rc=$?; e=$(date +%s%N)
    echo "selftest $args: rc $rc, $(( (e - s) / 1000000 )) ms wall; $(grep -E 'checks,' /tmp/st.txt)"; grep FAIL /tmp/st.txt | head -5
  done
  unset TEXTNET_CACHE
} > "$OUT/first-runs.txt" 2>&1
cat "$OUT/first-runs.txt"
{
  for round in 1 2; do
    echo "## before (b700823)"; timeout 60 /tmp/old bench nn 2>&1 | grep -E "64×64|MLP"
    echo "## after (eaaf6bc)"; timeout 60 /tmp/new bench nn 2>&1 | grep -E "64×64|MLP"
  done
} > "$OUT/bench-nn.txt" 2>&1
cat "$OUT/bench-nn.txt"
