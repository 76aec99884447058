#!/usr/bin/env bash
# One run on one H200: where examples/mnist_resnet.py's step spends its time (scripts/mnist_resnet_steps.py:
# the captured step replayed on a batch already on the GPU, the example's loop, the loop's host work alone;
# three rounds) with 40ad43e's and e30c49e's wheels; then the example itself with 40ad43e's, e30c49e's and
# bb57310's wheels beside scripts/mnist_resnet_torch.py (PyTorch eager), two epochs each, three rounds
# alternating. Wheels: `TEXTNET_PRECOMPILE=0 maturin build --release`, 40ad43e's in data/wheels, e30c49e's
# in data/wheels-e30c49e, bb57310's in data/wheels-old. Fashion-MNIST's four files xz'd in data/fmnist-xz.
# OUT set.
set -u
mkdir -p data/fashion-mnist
for f in data/fmnist-xz/*.xz; do xz -dc "$f" > "data/fashion-mnist/$(basename "$f" .xz)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --target /tmp/new data/wheels/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --target /tmp/mid data/wheels-e30c49e/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --target /tmp/old data/wheels-old/*.whl 2>&1 | tail -2
{
  for w in new mid; do
    echo "## $w"; PYTHONPATH=/tmp/$w timeout 120 python3 scripts/mnist_resnet_steps.py --data data/fashion-mnist
  done
} > "$OUT/steps.txt" 2>&1
resnet() { PYTHONPATH=$1 timeout 90 python3 examples/mnist_resnet.py --data data/fashion-mnist --kind fashion --device cuda --epochs 2 | grep epoch; }
{
  for round in 1 2 3; do
    echo "## textnet 40ad43e"; resnet /tmp/new
    echo "## textnet e30c49e"; resnet /tmp/mid
    echo "## textnet bb57310"; resnet /tmp/old
    [ $round = 3 ] || { echo "## torch eager"; timeout 90 python3 scripts/mnist_resnet_torch.py --data data/fashion-mnist --epochs 2; }
  done
} > "$OUT/mnist-resnet.txt" 2>&1
