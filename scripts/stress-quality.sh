#!/usr/bin/env bash
# Runs on the GPU machine: `textnet bench quality --no-cpu` (20,000 single-sample steps in CUDA graphs, then
# evaluation) over many seeds, $JOBS processes at a time, next to two PyTorch processes that keep the GPU
# time-sliced, for each binary given, in alternating rounds; prints one line per failed run and one per
# round. Looks for rare failures (one CUDA_ERROR_ILLEGAL_ADDRESS in ~700 runs so far, see BENCHMARKS.md).
# usage: scripts/stress-quality.sh BINARY... (env: ROUNDS 6, SEEDS_PER_ROUND 48, JOBS 6, BUDGET 300 s;
#        TEXTNET_NO_PDL=1 to run without programmatic dependent launch)
set -u
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
. "$(dirname "$0")/nvrtc-path.sh"
export TEXTNET_CACHE=${TEXTNET_CACHE:-/tmp/textnet-cache}
start=$(date +%s); work=$(mktemp -d)
for b in "$@"; do "$b" bench quality --seed 1 --no-cpu --dump "$work/dump" >/dev/null 2>&1 || echo "warm-up failed: $b"; done
load() { while true; do python3 benches/torch_baseline.py --quality "$work/dump" --quality-mode eager >/dev/null 2>&1; done; }
load & load1=$!; load & load2=$!
trap 'kill $load1 $load2 2>/dev/null' EXIT
for round in $(seq 1 "${ROUNDS:-6}"); do
  for b in "$@"; do
    export b work tag="$(basename "$b")-$round"
    first=$((round * 1000)); last=$((first + ${SEEDS_PER_ROUND:-48} - 1))
    seq "$first" "$last" | xargs -P "${JOBS:-6}" -I{} bash -c \
      '"$b" bench quality --seed {} --no-cpu --json --dump "$work/d$tag-{}" >"$work/o$tag-{}" 2>&1 || echo "FAIL $tag seed {}: $(grep -h error "$work/o$tag-{}")"'
    echo "$tag: seeds $first-$last done at $(( $(date +%s) - start ))s"
  done
  [ $(( $(date +%s) - start )) -gt "${BUDGET:-300}" ] && break
done
