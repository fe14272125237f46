#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round13b.sh OUT_DIR
# 1. The W4A16 decode-batch kernel with a deeper pipeline (sweep kind "rst": 5, 6 or 8 stages beside the
#    catalog's rule) at M=8 and 32: round 13a's Nsight Compute run showed the M=8 kernels at 22% achieved
#    occupancy and 0.65 waves, with 42% of scheduler cycles issuing nothing. Packed into OUT_DIR/round13b.tgz.
# 2. Eager decode of the Llama decoder with the swapped layers' reference bypass (benchmarks/dev/gpu_next.sh
#    eager, --serving-only): OUT_DIR/all_eager.tgz.
set -u
out=${1:?usage: gpu_round13b.sh OUT_DIR}
d=/tmp/round13b; mkdir -p "$d" "$out"
t0=$(date +%s)
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
(cd benchmarks/dev && timeout 230 python3 w4a16_sweep.py "$d/w4a16_sweep_stages.json" \
  --ms 8,32 --kinds rule,rst --jobs 15 > "$d/w4a16_sweep_stages.log" 2>&1)
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^compiled|^copy" "$d/w4a16_sweep_stages.log"
tar -C "$d" -czf "$out/round13b.tgz" .
E2E_ARGS=--serving-only bash benchmarks/dev/gpu_next.sh "$out" eager
