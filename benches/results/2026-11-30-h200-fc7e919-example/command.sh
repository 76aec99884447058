#!/usr/bin/env bash
# One run on one H200: examples/mnist_resnet.py with fc7e919's kernels beside the same model as a plain
# PyTorch eager loop (scripts/mnist_resnet_torch.py), two epochs each, two rounds alternating.
# fc7e919's nn.cu through TEXTNET_FUSED_DIR with f9102f0's wheel (data/wheels: no nn change since but these
# kernels); Fashion-MNIST's four files xz'd in data/fmnist-xz. OUT set.
set -u
mkdir -p data/fashion-mnist; for f in data/fmnist-xz/*.xz; do xz -dc "$f" > "data/fashion-mnist/$(basename "$f" .xz)"; done
export NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps --target /tmp/new data/wheels/*.whl >/dev/null 2>&1
resnet() { TEXTNET_FUSED_DIR=$PWD/fused PYTHONPATH=/tmp/new timeout 90 python3 examples/mnist_resnet.py --data data/fashion-mnist --kind fashion --device cuda --epochs 2 2>&1 | grep -E "epoch|fusions"; }
{ for round in 1 2; do
    echo "## textnet"; resnet
    echo "## torch eager"; timeout 90 python3 scripts/mnist_resnet_torch.py --data data/fashion-mnist --epochs 2
  done; } > $OUT/mnist-resnet.txt 2>&1
cat $OUT/mnist-resnet.txt
