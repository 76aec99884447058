#!/usr/bin/env bash
# One run on one host of 2 H200s (NVLink): tokens/s and peak memory with --grad-accum and --zero. Each run
# evaluates once, after its last step, and writes its model after that, so its tokens/s (the report's, from
# the start of training, the graph's capture included, to the end of that evaluation) counts no model write. GPT-2-small's body (12
# layers, 12 heads, 768 wide, block 1024), 60 steps: batch 16, 8 × 2, 4 × 4 on one GPU, 32 on 2 GPUs
# with and without --zero; nanoGPT's shape, 300 steps: 64 and 32 × 2 on one GPU and on two; twice each.
# Peak memory: nvidia-smi every 100 ms. Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet`
# at 2e4d1ec (with an experimental TEXTNET_TMA=forward option since dropped, unset here), stripped and
# xz'd to data/textnet-new.xz. Run from the repository root with OUT set.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-new.xz > /tmp/textnet && chmod +x /tmp/textnet
run() { # name, flags...
  local name=$1; shift
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > /tmp/mem-$name.txt &
  local smi=$!
  timeout 150 /tmp/textnet transformer corpus/tinyshakespeare.txt --out /tmp/$name.st --overwrite --json --quiet \
    --seed 1 --eval-every 100000 --eval-iters 2 "$@" > /tmp/$name.json 2> /tmp/$name.err
  local rc=$?
  kill $smi; wait $smi 2>/dev/null
  python3 - "$name" "$rc" "$@" <<'PY'
import json, sys
name, rc = sys.argv[1], sys.argv[2]
try:
    b = json.load(open(f"/tmp/{name}.json"))["epochs"][-1]
    peak = {}
    for line in open(f"/tmp/mem-{name}.txt"):
        i, m = [int(x) for x in line.split(",")]
        peak[i] = max(peak.get(i, 0), m)
    print(f"{name}: rc {rc}; {b['tokens_per_s']:,.0f} tokens/s over the {b['step']} steps ({b['elapsed_s']:.2f} s from the "
          f"first step's start to the end of the evaluation after the last); train loss {b['train_loss']:.4f}, val loss "
          f"{b['val_loss']:.4f}; peak MiB per GPU {peak}; flags {' '.join(sys.argv[3:])}")
except Exception as e:
    print(f"{name}: rc {rc}: {e!r}: {open(f'/tmp/{name}.err').read()[-400:]}")
PY
}
gpt2="--layers 12 --heads 12 --embed 768 --block 1024 --steps 60 --precision bf16 --lr 6e-4 --beta2 0.99 --weight-decay 0.1 --clip-norm 1 --no-bias --tie-weights"
{ for round in 1 2; do
    run gpt2-16x1 $gpt2 --batch 16
    run gpt2-8x2 $gpt2 --batch 8 --grad-accum 2
    run gpt2-4x4 $gpt2 --batch 4 --grad-accum 4
    run gpt2-2gpu $gpt2 --batch 32 --gpus 2
    run gpt2-2gpu-zero $gpt2 --batch 32 --gpus 2 --zero
  done; } > $OUT/gpt2-small.txt 2>&1
cat $OUT/gpt2-small.txt
nano="--layers 6 --heads 6 --embed 384 --block 256 --steps 300 --precision bf16 --lr 6e-4 --beta2 0.99 --weight-decay 0.1 --clip-norm 1 --no-bias --tie-weights"
{ for round in 1 2; do
    run nano-1gpu-64x1 $nano --batch 64
    run nano-1gpu-32x2 $nano --batch 32 --grad-accum 2
    run nano-2gpu-64x1 $nano --batch 64 --gpus 2
    run nano-2gpu-32x2 $nano --batch 32 --grad-accum 2 --gpus 2
  done; } > $OUT/nanogpt.txt 2>&1
cat $OUT/nanogpt.txt
