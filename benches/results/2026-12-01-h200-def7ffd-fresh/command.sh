#!/usr/bin/env bash
# One run on a freshly started H200: the first selftest of def7ffd's build (`TEXTNET_PRECOMPILE=1 cargo build
# --release --bin textnet`, stripped, xz'd to data/textnet-mend.xz; kernels built in, an empty kernel cache),
# --quick then the whole.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-mend.xz > /tmp/new && chmod +x /tmp/new
{
  export TEXTNET_CACHE=$(mktemp -d)
  for args in "--quick" ""; do
    s=$(date +%s%N); /tmp/new selftest $args > /tmp/st.txt 2>&1; rc=$?; e=$(date +%s%N)
    echo "selftest $args: rc $rc, $(( (e - s) / 1000000 )) ms wall; $(grep -E 'checks,' /tmp/st.txt)"; grep FAIL /tmp/st.txt | head -5
  done
  unset TEXTNET_CACHE
} > "$OUT/first-runs.txt" 2>&1
cat "$OUT/first-runs.txt"
