#!/usr/bin/env bash
# Runs on the GPU machine, all in one run (see BENCHMARKS.md): selftest, each pipeline's `textnet bench`
# next to its PyTorch baseline (`fit`'s baseline is `bench mnist`, the hand-fused MLP), and a full
# `textnet train` with predictions.
# Logs go under $OUT (default ./out): gpu.txt and one or two files per mode (`all` writes nineteen).
# usage: scripts/device-check.sh [selftest|bench|torch|quality|seeds|train|mnist|xor|matmul|sales|transformer|fit|sanitize|all]...
#   seeds:    the quality run (GPU only) for each seed in $SEEDS (default 1 to 6), $JOBS (default 4) seeds
#             at a time, into $OUT/quality_seeds.json; then their PyTorch twins (CUDA graph mode) in
#             $TORCH_JOBS (default 2) processes over disjoint runs of the seeds, into
#             $OUT/quality_seeds_torch.jsonl (one line per seed); TORCH_CHECK=1 adds --quality-check
#             (the first seed in eager mode too) to the first process. Prints the summary of
#             scripts/quality-seeds-summary.py.
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
    seeds|all) rm -rf /tmp/quality-seeds; mkdir -p /tmp/quality-seeds
               seeds=($(printf '%s\n' ${SEEDS:-1 2 3 4 5 6} | sort -n -u)); export bin
               printf '%s\n' "${seeds[@]}" | xargs -P "${JOBS:-4}" -I{} bash -c \
                 '$bin bench quality --seed {} --no-cpu --json --dump data/quality-seed{} >/tmp/quality-seeds/{}.json 2>&1' || status=1
               for s in "${seeds[@]}"; do cat "/tmp/quality-seeds/$s.json"; done >"$OUT/quality_seeds.json"
               tj=${TORCH_JOBS:-2}; [ "$tj" -ge 1 ] || tj=1; per=$(( (${#seeds[@]} + tj - 1) / tj )); pids=()
               for ((j = 0; j * per < ${#seeds[@]}; j++)); do
                 dirs=(); for s in "${seeds[@]:j*per:per}"; do dirs+=("data/quality-seed$s"); done
                 check=(); [ "$j" = 0 ] && [ "${TORCH_CHECK:-0}" = 1 ] && check=(--quality-check)
                 python3 benches/torch_baseline.py --quality "${dirs[@]}" ${check[@]+"${check[@]}"} \
                   >"/tmp/quality-seeds/torch$j.jsonl" 2>"/tmp/quality-seeds/torch$j.log" & pids+=($!)
               done
               for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || status=1; done
               for ((j = 0; j < ${#pids[@]}; j++)); do cat "/tmp/quality-seeds/torch$j.jsonl"; done >"$OUT/quality_seeds_torch.jsonl"
               for f in /tmp/quality-seeds/torch*.log; do [ -s "$f" ] && { echo "$f:"; tail -n 5 "$f"; }; done
               python3 scripts/quality-seeds-summary.py --brief "$OUT/quality_seeds.json" "$OUT/quality_seeds_torch.jsonl" ;;&
    sanitize) sanitizer=$(command -v compute-sanitizer || find / -name compute-sanitizer -type f -not -path '/proc/*' 2>/dev/null | head -1)
              if [ -z "$sanitizer" ]; then echo "compute-sanitizer not found" | tee "$OUT/sanitize.txt"; status=1
              else "$sanitizer" --tool memcheck --leak-check full "$bin" selftest --quick >"$OUT/sanitize.txt" 2>&1 || status=1; tail -20 "$OUT/sanitize.txt"; fi ;;&
    train|all) { time $bin train corpus/shakespeare.txt --out /tmp/textnet.safetensors 2>&1
                 for c in "to be or" "my lord" "i pray you"; do $bin predict --model /tmp/textnet.safetensors --context "$c"; done
               } >"$OUT/train.txt" 2>&1 || status=1; cat "$OUT/train.txt" ;;&
    xor|all) $bin bench xor --json >"$OUT/bench_xor.json" || status=1
             python3 benches/torch_xor.py >"$OUT/torch_xor.json" || status=1; cat "$OUT/bench_xor.json" "$OUT/torch_xor.json" ;;&
    matmul|all) $bin bench matmul --json >"$OUT/bench_matmul.json" || status=1
                python3 benches/torch_matmul.py >"$OUT/torch_matmul.json" || status=1; cat "$OUT/bench_matmul.json" "$OUT/torch_matmul.json" ;;&
    sales|all) [ -f data/sales.tsv ] || python3 scripts/make-sales.py --out data/sales.tsv
               $bin bench sales --json >"$OUT/bench_sales.json" || status=1
               python3 benches/torch_sales.py >"$OUT/torch_sales.json" || status=1
               grep -E '"(train_device_ms|train_wall_s|us_per_step_device|test_mae|baseline_mae|cpu_test_mae|gpu_vs_cpu_mae)"' "$OUT/bench_sales.json"
               grep -E '"(seconds|seconds_50_epochs_scaled|test_mae)"' "$OUT/torch_sales.json" ;;&
    mnist|all) $bin bench mnist --json >"$OUT/bench_mnist.json" || status=1
               python3 benches/torch_mnist.py >"$OUT/torch_mnist.json" || status=1; tail -c 600 "$OUT/bench_mnist.json"; tail -c 400 "$OUT/torch_mnist.json" ;;&
    transformer|all) $bin bench transformer --json >"$OUT/bench_transformer.json" || status=1
                     python3 benches/torch_transformer.py >"$OUT/torch_transformer.json" || status=1
                     cat "$OUT/bench_transformer.json" "$OUT/torch_transformer.json" ;;&
    fit|all) $bin bench fit --json >"$OUT/bench_fit.json" || status=1; cat "$OUT/bench_fit.json" ;;&
    *) ;;
  esac
done
exit $status
