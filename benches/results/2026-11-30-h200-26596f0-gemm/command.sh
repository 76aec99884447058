#!/usr/bin/env bash
# gemm_tile's staging, its two changes apart: `bench nn`'s captured MLP step and `bench fit` with this
# commit's binary compiling four fused/ folders (TEXTNET_FUSED_DIR): this commit's; with a4c1695's
# gemm.cuh (signed indices, no assumption); without the `__builtin_assume` (unsigned only); with a4c1695's
# indices and the assumption (assume only). Two rounds, alternating. Before them, the all-ignored loss's
# mutation with its control (the unmutated `selftest --only nn`). One run on one H200. Binary:
# `TEXTNET_PRECOMPILE=0 cargo build --release --bin textnet`, stripped, xz'd to data/textnet.xz; the
# folders in data/fused-variants (fused/ with the variant's gemm.cuh). OUT set. `bench fit` found no data in
# this run (data/fashion-mnist was not carried), so gemm-variants.txt keeps bench nn's lines; bench fit's
# figures for this commit and a4c1695 are in 2026-11-30-h200-efe3cac.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
xz -dc data/textnet.xz > /tmp/textnet && chmod +x /tmp/textnet
python3 scripts/mutants.py --bin /tmp/textnet --jobs 2 "every row is ignored" > "$OUT/mutants.txt" 2>&1
{
  for round in 1 2; do
    for v in this a4c1695 no-assume no-unsigned; do
      dir=$PWD/fused; [ $v = this ] || dir=$PWD/data/fused-variants/$v
      echo "## $v"
      TEXTNET_FUSED_DIR=$dir timeout 60 /tmp/textnet bench fit --repeats 5 --json | python3 -c "import json,sys; d=json.load(sys.stdin); print('bench fit us_per_step', d['us_per_step'])"
      TEXTNET_FUSED_DIR=$dir timeout 90 /tmp/textnet bench nn --repeats 5 | grep -E "MLP 784-128-10 step, captured"
    done
  done
} > "$OUT/gemm-variants.txt" 2>&1
