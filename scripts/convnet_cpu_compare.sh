#!/usr/bin/env bash
# Keras's mnist_convnet on the CPU, textnet beside PyTorch: scripts/textnet_convnet_cpu.py and
# scripts/torch_convnet_cpu.py run alternately, ROUNDS rounds each (3), both at THREADS threads (the
# machine's cores: RAYON_NUM_THREADS for textnet, torch.set_num_threads for PyTorch), BATCHES timed
# batches of 128; prints each run's JSON, then the median samples/s of each and their ratio.
#
# usage: scripts/convnet_cpu_compare.sh   (env: PYTHON=python3, TORCH_PYTHON=$PYTHON, THREADS=nproc,
#        ROUNDS=3, BATCHES=50; textnet importable by PYTHON, torch by TORCH_PYTHON)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
torch_python=${TORCH_PYTHON:-$python}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
batches=${BATCHES:-50}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
    echo "round $round of $rounds" >&2
    RAYON_NUM_THREADS=$threads "$python" "$here/textnet_convnet_cpu.py" --threads "$threads" --batches "$batches" \
        | tee -a "$out"
    OMP_NUM_THREADS=$threads "$torch_python" "$here/torch_convnet_cpu.py" --threads "$threads" --batches "$batches" \
        | tee -a "$out"
done
"$python" - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
median = {f: statistics.median(r["samples_per_s"] for r in runs if r["framework"] == f) for f in ("textnet", "pytorch")}
print(json.dumps({"median_samples_per_s": median, "textnet_over_pytorch": median["textnet"] / median["pytorch"],
                  "threads": runs[0]["threads"], "rounds": len(runs) // 2}))
PY
