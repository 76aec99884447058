#!/usr/bin/env bash
# A per-kernel profile of the Transformer's training step in bf16 at nanoGPT's shape (6 layers, 6 heads,
# 384 wide, block 256, batch 64) and at GPT-2-small's body (12, 12, 768, block 1024, batch 16), dropout 0.2:
# first each shape's tokens/s without the profiler (200 and 30 steps), then ncu's time, compute and memory
# throughput of every kernel of one step (the last of 4 and of 2), tabled by scripts/ncu_step_table.py.
# Binary: `TEXTNET_PRECOMPILE=0 cargo build --release --bin textnet` at 4ee1108 (kernels compiled at run
# time, before the timed steps), stripped and xz-compressed to data/; data/tinyshakespeare.txt. OUT set.
set -u
[ -x /tmp/textnet ] || { xz -dc data/textnet.xz > /tmp/textnet && chmod +x /tmp/textnet; }
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
run() { /tmp/textnet transformer data/tinyshakespeare.txt --precision bf16 --dropout 0.2 --eval-every 100000 \
  --eval-iters 1 --overwrite --out /tmp/profile.safetensors "$@"; }
NANOGPT="--layers 6 --heads 6 --embed 384 --block 256 --batch 64"
GPT2="--layers 12 --heads 12 --embed 768 --block 1024 --batch 16"
METRICS=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
profile() { timeout 240 ncu --target-processes all --csv --metrics $METRICS bash -c "$(declare -f run); run $*" 2>/dev/null \
  | python3 scripts/ncu_step_table.py --boundary tf_adamw; }
# Parts (all when none is named): steps, nanogpt, gpt2.
for part in ${@:-steps nanogpt gpt2}; do
  case $part in
    steps) {
      echo "## nanoGPT's shape, 200 steps"; timeout 120 bash -c "$(declare -f run); run $NANOGPT --steps 200" 2>&1 | tr '\r' '\n' | tail -4
      echo "## GPT-2-small's body, 30 steps"; timeout 150 bash -c "$(declare -f run); run $GPT2 --steps 30" 2>&1 | tr '\r' '\n' | tail -4
    } > "$OUT/steps.txt" ;;
    nanogpt) profile $NANOGPT --steps 4 > "$OUT/nanogpt-kernels.md" 2>&1 ;;
    gpt2) profile $GPT2 --steps 2 > "$OUT/gpt2-kernels.md" 2>&1 ;;
  esac
done
