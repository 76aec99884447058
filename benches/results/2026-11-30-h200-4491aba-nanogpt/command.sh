#!/usr/bin/env bash
# One run on one H200 at nanoGPT's shape (6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2, bf16):
# `textnet bench transformer --large --precision bf16 --dropout 0.2` (200 steps, device events), then nanoGPT's
# own train.py (3adf61e, unchanged: bf16 autocast, torch.compile; config/train_shakespeare_char.py, its first
# 600 iterations), then the bench again. nanoGPT's step: the median of its logged iteration times.
# Binary: `cargo build --release --bin textnet` at 4491aba (data/textnet-wgmma.xz); nanoGPT at 3adf61e
# (model.py, train.py, configurator.py, config/, data/shakespeare_char/prepare.py) in data/nanogpt with
# corpus/tinyshakespeare.txt as its input.txt. Run from the repository root with OUT set.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-wgmma.xz > /tmp/textnet && chmod +x /tmp/textnet
bench() { timeout 120 /tmp/textnet bench transformer --large --precision bf16 --dropout 0.2 --corpus corpus/tinyshakespeare.txt 2>&1 | grep -E "^transformer on|error"; }
mkdir -p /tmp/stub && : > /tmp/stub/requests.py
(cd data/nanogpt/data/shakespeare_char && PYTHONPATH=/tmp/stub python3 prepare.py > /dev/null)
{ echo "## textnet"; bench
  echo "## nanoGPT train.py"
  (cd data/nanogpt && S=$(date +%s); timeout 300 python3 train.py config/train_shakespeare_char.py --max_iters=600 --lr_decay_iters=600 > /tmp/nanogpt.log 2>&1; echo "rc $? seconds $(( $(date +%s) - S ))")
  python3 - <<'PY'
import re, statistics
times = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", open("/tmp/nanogpt.log").read()) if int(m.group(1)) >= 50]
print(f"nanoGPT: {len(times)} logged iterations from 50 on, median {statistics.median(times):.2f} ms, {64 * 256 / statistics.median(times) * 1e3 / 1e6:.3f} M tokens/s")
PY
  echo "## textnet"; bench
} > "$OUT/nanogpt-shape.txt" 2>&1
cp /tmp/nanogpt.log "$OUT/nanogpt.log"
cat "$OUT/nanogpt-shape.txt"
