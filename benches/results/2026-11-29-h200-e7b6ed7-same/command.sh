#!/usr/bin/env bash
# Behaviour after the run flags became one group and the commands were split (e7b6ed7) against 4ee1108,
# on the GPU: the same short runs of `transformer`, `train`, `mnist` (MLP and CNN) and `fit` with each
# binary at the same seed; the model files' SHA-256 and the --json reports without their times must match.
# Binaries: `TEXTNET_PRECOMPILE=0 cargo build --release --bin textnet` at each commit, stripped and
# xz-compressed (data/textnet.xz is 4ee1108's, data/textnet-merged.xz e7b6ed7's); data/fashion-small,
# data/tinyshakespeare.txt. OUT set.
set -u
xz -dc data/textnet.xz > /tmp/4ee1108 && xz -dc data/textnet-merged.xz > /tmp/e7b6ed7 && chmod +x /tmp/4ee1108 /tmp/e7b6ed7
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
FASHION="--dataset fashion --data $PWD/data/fashion-small --epochs 2 --train-limit 4000 --device cuda --overwrite --json"
for c in 4ee1108 e7b6ed7; do
  mkdir -p /tmp/$c-out; cd /tmp/$c-out
  B=/tmp/$c; S=$OLDPWD
  $B transformer $S/data/tinyshakespeare.txt --layers 2 --heads 2 --embed 64 --block 64 --batch 16 --steps 60 \
    --eval-every 20 --eval-iters 2 --seed 3 --device cuda --out tf.safetensors --overwrite --json > tf.json 2> tf.err
  $B transformer $S/data/tinyshakespeare.txt --layers 2 --heads 2 --embed 64 --block 64 --batch 16 --steps 60 \
    --eval-every 20 --eval-iters 2 --seed 3 --device cuda --precision bf16 --out tf16.safetensors --overwrite --json > tf16.json 2> tf16.err
  head -c 100000 $S/data/tinyshakespeare.txt > small.txt
  $B train small.txt --epochs 2 --device cuda --out text.safetensors --overwrite --json > text.json 2> text.err
  $B mnist $FASHION --out mlp.safetensors > mlp.json 2> mlp.err
  $B mnist $FASHION --model cnn --out cnn.safetensors > cnn.json 2> cnn.err
  $B fit --layers "Linear(784, 32), Relu, Dropout(0.1), Linear(32, 10)" $FASHION --out fit.safetensors > fit.json 2> fit.err
  cd $S
done
{
  for f in tf tf16 text mlp cnn fit; do
    a=$(sha256sum < /tmp/4ee1108-out/$f.safetensors | cut -c1-16); b=$(sha256sum < /tmp/e7b6ed7-out/$f.safetensors | cut -c1-16)
    same=$(python3 - /tmp/4ee1108-out/$f.json /tmp/e7b6ed7-out/$f.json <<'PY'
import json, sys
def strip(v):
    if isinstance(v, dict):
        timed = lambda k: "time" in k or "second" in k or "elapsed" in k or k.endswith(("_s", "_ms", "_us", "per_s"))
        return {k: strip(x) for k, x in v.items() if not timed(k) and k not in ("textnet", "model", "path", "out")}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
a, b = (strip(json.load(open(p))) for p in sys.argv[1:])
print("report same" if a == b else "report differs: " + json.dumps([k for k in a if a.get(k) != b.get(k)]))
PY
)
    echo "$f: model $a $b $([ "$a" = "$b" ] && echo same || echo DIFFERENT); $same"
  done
  tail -n 2 /tmp/e7b6ed7-out/*.err
} > "$OUT/same.txt" 2>&1
