#!/usr/bin/env bash
# One run on one H200 at GPT-2-small's body (12 layers, 12 heads, 768 wide, block 1024, batch 16, dropout 0.2,
# bf16, Shakespeare-char's vocabulary): `textnet bench transformer --gpt2-small --precision bf16 --dropout 0.2`
# (30 steps, device events), then nanoGPT's train.py (3adf61e, unchanged: bf16 autocast, torch.compile) at that
# shape for 200 iterations, then the bench again. nanoGPT's step: the median of its logged iteration times.
# Binary: `cargo build --release --bin textnet` at 4491aba (data/textnet-wgmma.xz); nanoGPT at 3adf61e in
# data/nanogpt with corpus/tinyshakespeare.txt as its input.txt. Run from the repository root with OUT set.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-wgmma.xz > /tmp/textnet && chmod +x /tmp/textnet
bench() { timeout 120 /tmp/textnet bench transformer --gpt2-small --precision bf16 --dropout 0.2 --corpus corpus/tinyshakespeare.txt 2>&1 | grep -E "^transformer on|error"; }
mkdir -p /tmp/stub && : > /tmp/stub/requests.py
(cd data/nanogpt/data/shakespeare_char && PYTHONPATH=/tmp/stub python3 prepare.py > /dev/null)
{ echo "## textnet"; bench
  echo "## nanoGPT train.py"
  (cd data/nanogpt && S=$(date +%s); timeout 300 python3 train.py config/train_shakespeare_char.py --n_layer=12 --n_head=12 \
     --n_embd=768 --block_size=1024 --batch_size=16 --max_iters=200 --lr_decay_iters=200 --eval_interval=1000 \
     > /tmp/nanogpt.log 2>&1; echo "rc $? seconds $(( $(date +%s) - S ))")
  python3 - <<'PY'
import re, statistics
times = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", open("/tmp/nanogpt.log").read()) if int(m.group(1)) >= 50]
print(f"nanoGPT: {len(times)} logged iterations from 50 on, median {statistics.median(times):.2f} ms, {16 * 1024 / statistics.median(times) * 1e3 / 1e3:.1f} k tokens/s")
PY
  echo "## textnet"; bench
} > "$OUT/gpt2-small.txt" 2>&1
cp /tmp/nanogpt.log "$OUT/nanogpt.log"
cat "$OUT/gpt2-small.txt"
