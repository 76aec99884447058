#!/usr/bin/env bash
# 9481144 on one freshly started H200, 2026-12-02, from the repository root with OUT set; the first part's
# files (selftest.txt, bench-text.jsonl, mutants.txt) came from one command, the recipe's (nanogpt-*.txt,
# warm-up.txt) from the next on the same machine.
# Binaries: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet`, stripped, xz: data/textnet-head.xz at
# 9481144 (with bc58120's scripts/mutants.py, which takes --part), data/textnet-base.xz at 51d3f86 (main before the
# text-buffers merge). The wheel: `TEXTNET_PRECOMPILE=0 maturin build --release` at 9481144 in data/wheels
# (a short run compiles its kernels into the cache first). nanoGPT at 3adf61e (model.py, train.py,
# configurator.py, config/, data/shakespeare_char/prepare.py) in data/nanogpt.
#   selftest.txt: the first selftest on the machine (--quick), then the whole selftest; their times are
#     the selftest's own lines (bc, which the script meant to time them with, is not on the machine).
#   bench-text.jsonl: every `bench text` configuration, 51d3f86's build and 9481144's, alternating, two rounds.
#   mutants.txt: the text kernels' mutations, then the bf16 backward's fused slopes (nn).
#   nanogpt-textnet.txt, nanogpt-torch.txt: nanoGPT's Shakespeare-char recipe in full, examples/nanogpt.py
#     then nanoGPT's train.py, each line stamped with the seconds since the command started.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-head.xz > /tmp/textnet && chmod +x /tmp/textnet
xz -dc data/textnet-base.xz > /tmp/textnet-base && chmod +x /tmp/textnet-base
{
  echo "## selftest --quick, first run on this machine"; S=$(date +%s.%N)
  timeout 200 /tmp/textnet selftest --quick > /tmp/quick.txt 2>&1; echo "rc $? seconds $(echo "$(date +%s.%N) - $S" | bc)"
  grep -E "checks,|FAIL" /tmp/quick.txt | head -12
  echo "## selftest (full)"; S=$(date +%s.%N)
  timeout 200 /tmp/textnet selftest > /tmp/full.txt 2>&1; echo "rc $? seconds $(echo "$(date +%s.%N) - $S" | bc)"
  grep -E "checks,|FAIL" /tmp/full.txt | head -12
  grep -iE "backward fusion|^text|text " /tmp/full.txt | head -40
} > "$OUT/selftest.txt" 2>&1
{
  for round in 1 2; do
    for b in base head; do
      bin=/tmp/textnet; [ $b = base ] && bin=/tmp/textnet-base
      echo "## $b round $round"; timeout 120 $bin bench text --json
    done
  done
} > "$OUT/bench-text.jsonl" 2> "$OUT/bench-text.err"
{
  timeout 200 python3 scripts/mutants.py --bin /tmp/textnet --jobs 4 --part text
  timeout 200 python3 scripts/mutants.py --bin /tmp/textnet --jobs 4 "bf16 backward's fused"
} > "$OUT/mutants.txt" 2>&1
# The recipe, the next command:
pip install -q --no-deps --target /tmp/py data/wheels/*.whl > /dev/null 2>&1
cp corpus/tinyshakespeare.txt data/nanogpt/data/shakespeare_char/input.txt
mkdir -p /tmp/stub && : > /tmp/stub/requests.py
(cd data/nanogpt/data/shakespeare_char && PYTHONPATH=/tmp/stub python3 prepare.py > /dev/null)
stamped() {  # each line prefixed by the seconds since the pipe started
  python3 -c "import sys,time; t=time.time(); [print(f'{time.time()-t:8.2f} {l}', end='', flush=True) for l in sys.stdin]"
}
PYTHONPATH=/tmp/py timeout 120 python3 examples/nanogpt.py --data corpus/tinyshakespeare.txt --device cuda \
  --max-iters 4 --eval-interval 2 --eval-iters 2 --sample-tokens 8 > "$OUT/warm-up.txt" 2>&1
PYTHONPATH=/tmp/py timeout 200 python3 -u examples/nanogpt.py --data corpus/tinyshakespeare.txt --device cuda 2>&1 | stamped > "$OUT/nanogpt-textnet.txt"
(cd data/nanogpt && timeout 250 python3 -u train.py config/train_shakespeare_char.py 2>&1 | stamped > "$OUT/nanogpt-torch.txt")
