#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round26a.sh OUT_DIR   (issue 12; prepared in round 26, not yet run)
# 1. The W4A16 MMA-GEMV with four and eight row tiles a warp (w4a16_sweep.py kind "mv4") beside the catalog's rule
#    kernel and cuBLAS fp16 at M = 16 and 32, where round 24 found the activation loads setting the pace.
# 2. W4A16 alone on the product path at this tree (gpu_round24d.sh): the MMA reduce moved into a shared device helper
#    in round 25 (ts_mma_reduce_store), compiled on CPU only until this call.
# Needs .gpu/site.tar.xz carried. OUT_DIR/mv4/all.tgz and OUT_DIR/w4a16/all.tgz.
set -u
out=${1:?usage: gpu_round26a.sh OUT_DIR}
mkdir -p "$out"
SWEEP_TIMEOUT=300 bash benchmarks/dev/gpu_round24b.sh "$out/mv4" 16,32 mv4,rule
bash benchmarks/dev/gpu_round24d.sh "$out/w4a16"
echo "total $SECONDS s"
