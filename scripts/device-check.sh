#!/usr/bin/env bash
# Runs on the GPU machine, in one session (see BENCHMARKS.md): selftest, `textnet bench` (text speed,
# text quality, MNIST) each next to its PyTorch baseline, and a full `textnet train` with predictions.
# Logs go under $OUT (default ./out), eight files at most.
# usage: scripts/device-check.sh [selftest|bench|torch|quality|seeds|train|mnist|sanitize|all]...
#   seeds:    the quality run (GPU only) and its PyTorch twin for each seed in $SEEDS (default 1 to 6),
#             $JOBS (default 4) seeds at a time
#   sanitize: `textnet selftest --quick` under compute-sanitizer memcheck (not part of all)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
bin=./target/release/textnet
export TEXTNET_CACHE=${TEXTNET_CACHE:-/tmp/textnet-cache} PYTHONUNBUFFERED=1
. "$(dirname "$0")/nvrtc-path.sh"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv; date -u; } | tee "$OUT/gpu.txt"
status=0
for what in "${@:-all}"; do
  case $what in
    selftest|all) $bin selftest 2>&1 | tee "$OUT/selftest.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;&
    bench|all) $bin bench --json >"$OUT/bench.json" || status=1; cat "$OUT/bench.json" ;;&
    torch|all) python3 benches/torch_baseline.py >"$OUT/torch.json" || status=1; cat "$OUT/torch.json" ;;&
    quality|all) { $bin bench quality --json && python3 benches/torch_baseline.py --quality data/quality; } >"$OUT/quality.json" || status=1
                 cat "$OUT/quality.json" ;;&
    seeds|all) mkdir -p /tmp/quality-seeds
               quality_seed() {
                 $bin bench quality --seed "$1" --no-cpu --json --dump "data/quality-seed$1" &&
                   python3 benches/torch_baseline.py --quality "data/quality-seed$1"
               }
               export -f quality_seed; export bin
               printf '%s\n' ${SEEDS:-1 2 3 4 5 6} |
                 xargs -P "${JOBS:-4}" -I{} bash -c 'quality_seed {} >/tmp/quality-seeds/{}.json 2>&1' || status=1
               cat /tmp/quality-seeds/*.json >"$OUT/quality_seeds.json"; cat "$OUT/quality_seeds.json" ;;&
    sanitize) sanitizer=$(command -v compute-sanitizer || find / -name compute-sanitizer -type f -not -path '/proc/*' 2>/dev/null | head -1)
              if [ -z "$sanitizer" ]; then echo "compute-sanitizer not found" | tee "$OUT/sanitize.txt"; status=1
              else "$sanitizer" --tool memcheck --leak-check full "$bin" selftest --quick >"$OUT/sanitize.txt" 2>&1 || status=1; tail -20 "$OUT/sanitize.txt"; fi ;;&
    train|all) { time $bin train corpus/shakespeare.txt --out /tmp/textnet.safetensors 2>&1
                 for c in "to be or" "my lord" "i pray you"; do $bin predict --model /tmp/textnet.safetensors --context "$c"; done
               } >"$OUT/train.txt" 2>&1 || status=1; cat "$OUT/train.txt" ;;&
    mnist|all) $bin bench mnist --json >"$OUT/bench_mnist.json" || status=1
               python3 benches/torch_mnist.py >"$OUT/torch_mnist.json" || status=1; tail -c 600 "$OUT/bench_mnist.json"; tail -c 400 "$OUT/torch_mnist.json" ;;&
    *) ;;
  esac
done
exit $status
