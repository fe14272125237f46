#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round16a.sh OUT_DIR   (issue 13, round 16, calls 1-3)
# catalog/gemv_kn.py's block shapes vs cuBLAS at the tuned project's (N, K) pairs, M 1..16 (gemv_kn_sweep.py).
set -u
out=${1:?usage: gpu_round16a.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/dev
t0=$(date +%s)
timeout 420 python3 benchmarks/dev/gemv_kn_sweep.py "$out/gemv_kn_sweep.json" --jobs 15 --dtypes float16 \
  > "$out/gemv_kn_sweep.log" 2>&1
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "cuBLAS|BEST|compiled" "$out/gemv_kn_sweep.log" | head -80
