#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round26a.sh OUT_DIR   (issue 12; prepared in round 26, not yet run)
# The W4A16 MMA-GEMV with four and eight row tiles a warp (w4a16_sweep.py kind "mv4", 222 variants) beside the
# catalog's rule kernel and cuBLAS fp16 at M = 16 and 32, where round 24 found the activation loads setting the
# pace. Run gpu_round24d.sh in a call of its own after it: W4A16 on the product path at this tree (round 25 moved
# the MMA reduce into a shared device helper, ts_mma_reduce_store, compiled on CPU only so far).
# Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round26a.sh OUT_DIR}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-520} bash benchmarks/dev/gpu_round24b.sh "$out" 16,32 mv4,rule
