#!/usr/bin/env bash
# One run on a freshly started H200:
# 1. bb57310 built with its kernels compiled in (TEXTNET_PRECOMPILE=1), an empty kernel cache: the first
#    `selftest --quick`, then the full selftest (the nn part now 948 checks).
# 2. 47c9cf4's wheel (direct convolutions of 8 result channels a block, padded tile pitches): the nn
#    selftest at three seeds; examples/mnist_resnet.py with it and with bb57310's wheel, beside
#    scripts/mnist_resnet_torch.py (PyTorch eager), two epochs each, two rounds alternating; the step's
#    kernels under ncu with each wheel; the direct kernels' speed-of-light, warp-state and shared-memory
#    sections under ncu with each wheel.
# Binary: `TEXTNET_PRECOMPILE=1 cargo build --release --bin textnet` at bb57310, stripped, xz'd to
# data/textnet-pre-bb57310.xz. Wheels: `TEXTNET_PRECOMPILE=0 maturin build --release`, 47c9cf4's in
# data/wheels, bb57310's in data/wheels-old. Fashion-MNIST's four files xz'd in data/fmnist-xz. OUT set.
set -u
mkdir -p data/fashion-mnist
for f in data/fmnist-xz/*.xz; do xz -dc "$f" > "data/fashion-mnist/$(basename "$f" .xz)"; done
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet-pre-bb57310.xz > /tmp/textnet-pre && chmod +x /tmp/textnet-pre
timed() {  # timed SECONDS COMMAND...: its last lines, exit status and wall seconds
  local s=$(date +%s.%N); timeout "$@" 2>&1 | tail -3; local rc=${PIPESTATUS[0]}
  echo "rc $rc wall $(python3 -c "import sys,time; print(round(time.time() - float(sys.argv[1]), 1))" "$s") s"
}
{
  export TEXTNET_CACHE=/tmp/fresh-cache
  rm -rf "$TEXTNET_CACHE"
  echo "## selftest --quick"; timed 90 bash -c '/tmp/textnet-pre selftest --quick > /tmp/quick.txt; rc=$?; tail -2 /tmp/quick.txt; exit $rc'
  grep FAIL /tmp/quick.txt | cut -c1-250 | head -5
  echo "## selftest"; timed 120 bash -c '/tmp/textnet-pre selftest > /tmp/full.txt; rc=$?; tail -2 /tmp/full.txt; exit $rc'
  grep FAIL /tmp/full.txt | cut -c1-250 | head -5
  unset TEXTNET_CACHE
} > "$OUT/first-runs.txt" 2>&1
python3 -m pip install -q --no-deps --target /tmp/new data/wheels/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --target /tmp/old data/wheels-old/*.whl 2>&1 | tail -2
for seed in None 7943312748392794586 11; do
  PYTHONPATH=/tmp/new timeout 120 python3 -c "
import sys, textnet
rows = textnet.selftest(only=['nn'], seed=$seed)
bad = [r for r in rows if not r['passed']]
print('seed', rows[0]['seed'], len(rows), 'checks,', len(bad), 'failed')
for r in bad[:5]: print('  FAIL', r['kernel'], r['shape'][:160], r['rel_error'], r['tolerance'])
" 2>&1 | tail -6
done > "$OUT/selftest-nn.txt"
resnet() { PYTHONPATH=$1 timeout 90 python3 examples/mnist_resnet.py --data data/fashion-mnist --kind fashion --device cuda --epochs 2 | grep epoch; }
{
  for round in 1 2; do
    echo "## textnet 47c9cf4"; resnet /tmp/new
    echo "## textnet bb57310"; resnet /tmp/old
    echo "## torch eager"; timeout 90 python3 scripts/mnist_resnet_torch.py --data data/fashion-mnist --epochs 2
  done
} > "$OUT/mnist-resnet.txt" 2>&1
short=(examples/mnist_resnet.py --data data/fashion-mnist --kind fashion --device cuda --epochs 1 --train-samples 1280 --test-samples 128)
for w in new old; do
  echo "## $w"
  PYTHONPATH=/tmp/$w timeout 150 ncu --csv --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed \
    python3 "${short[@]}" > /tmp/resnet-$w.csv 2> /tmp/ncu-$w.err
  python3 scripts/ncu_step_table.py --boundary nn_update_tensors < /tmp/resnet-$w.csv 2>&1
  tail -2 /tmp/ncu-$w.err
done > "$OUT/resnet-ncu.txt" 2>&1
for w in new old; do
  PYTHONPATH=/tmp/$w timeout 100 ncu --kernel-name regex:nn_conv2d_direct --launch-skip 14 --launch-count 14 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed_pipe_lsu.sum,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active \
    python3 "${short[@]}" > "$OUT/ncu-direct-$w.txt" 2>&1
done
