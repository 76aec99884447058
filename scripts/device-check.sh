#!/usr/bin/env bash
# Runs on the GPU machine (see BENCHMARKS.md): selftest, the ignored GPU tests' checks, `textnet bench`
# and the PyTorch baseline in one session, logs under $OUT (default ./out).
# usage: scripts/device-check.sh [selftest|bench|torch|train|all]...
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
bin=./target/release/textnet
export TEXTNET_CACHE=${TEXTNET_CACHE:-/tmp/textnet-cache}
# libnvrtc may sit outside the loader's path (a toolkit's lib64 or PyTorch's wheel): add its folder.
if ! ldconfig -p | grep -q 'libnvrtc\.so'; then
  lib=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | grep -v builtins | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "nvrtc: ${LD_LIBRARY_PATH:-from ldconfig}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
status=0
for what in "${@:-all}"; do
  case $what in
    selftest|all) $bin selftest 2>&1 | tee "$OUT/selftest.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;&
    bench|all) $bin bench --json >"$OUT/bench.json" 2>"$OUT/bench.err" || status=1; cat "$OUT/bench.json" "$OUT/bench.err" ;;&
    torch|all) PYTHONUNBUFFERED=1 python3 benches/torch_baseline.py >"$OUT/torch.json" 2>&1 || status=1; cat "$OUT/torch.json" ;;&
    mnist|all) $bin bench mnist --json >"$OUT/bench_mnist.json" 2>"$OUT/bench_mnist.err" || status=1; PYTHONUNBUFFERED=1 python3 benches/torch_mnist.py >"$OUT/torch_mnist.json" 2>&1 || status=1; cat "$OUT/bench_mnist.json" "$OUT/bench_mnist.err" "$OUT/torch_mnist.json" ;;&
    *) ;;
  esac
done
exit $status
