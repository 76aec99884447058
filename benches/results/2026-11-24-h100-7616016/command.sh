#!/usr/bin/env bash
# Ran on the H100 from the repository root at 7616016 (gemm_tile and gemm_tile_tf32 over one staging loop), OUT set.
set -u
export TEXTNET_CACHE=/tmp/tc
. scripts/nvrtc-path.sh
B=target/release/textnet
$B selftest > $OUT/selftest.txt 2>&1
$B bench transformer --json; $B bench transformer --tf32 --json; $B bench matmul   # unchanged: 0.389 s, 0.359 s; tile64 0.1275 ms
