#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round29a.sh OUT_DIR   (issue 12, round 29)
# W4A16 at M=8 and 32 on down (14336 -> 4096) and gate_up (4096 -> 28672), the 2.5x-over-cuBLAS shapes:
# the MMA-GEMV with K split across a cluster's CTAs (w4a16_sweep.py kind "mvc", catalog/w4a16_mma_split.py,
# new in round 29) and with four and eight row tiles a warp ("mv4", prepared in round 26, never run) beside the
# catalog's rule kernel and cuBLAS fp16; every variant checked against float32. Needs .gpu/site.tar.xz carried.
# OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round29a.sh OUT_DIR}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-450} bash benchmarks/dev/gpu_round24b.sh "$out" "${MS:-32,8}" mvc,mv4,rule \
  "${OPS:-down,gate_up}"
