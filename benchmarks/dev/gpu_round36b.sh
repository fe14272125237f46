#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round36b.sh OUT_DIR   (issues 12 and 14, round 36)
# 1. gpu_round24d.sh: W4A16 on the product path at this tree (build benchmarks/decode/w4a16.toml, tileship verify
#    --grid 2, decode_kernels.py --ops w4a16_linear): issue 12's M=1/8/32 ratios (OUT_DIR/w4a16/all.tgz).
# 2. gpu_native.sh overhead: the launch path (fast_launch_check.py, runtime_overhead.py --rounds 15), issue 14
#    (OUT_DIR/all_overhead.tgz), when at least 100 s of BUDGET_S (default 540) are left. Needs .gpu/site.tar.xz.
set -u
out=${1:?usage: gpu_round36b.sh OUT_DIR}
mkdir -p "$out/w4a16"
SECONDS=0
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-170} KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-130} \
  bash benchmarks/dev/gpu_round24d.sh "$out/w4a16"
echo "w4a16 done at ${SECONDS} s"
if [ $(( ${BUDGET_S:-540} - SECONDS )) -lt 100 ]; then echo "no time left for the launch path (${SECONDS} s)"; exit 0; fi
bash benchmarks/dev/gpu_native.sh "$out" overhead
echo "total ${SECONDS} s"
