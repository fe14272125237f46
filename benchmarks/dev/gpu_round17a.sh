#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round17a.sh OUT_DIR   (issue 13, round 17, call 1)
# Small-M GEMM tiles vs cuBLAS at the tuned project's (N, K) pairs, M 1..128 (gemv_kn_sweep.py): the
# catalog's tiled GEMM with narrow tiles, its split-K form, the swapped-operand GEMM (catalog/gemm_small_m.py)
# and the GEMV, fp16, kernels alone (CUDA events around one call after an L2 flush).
set -u
out=${1:?usage: gpu_round17a.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/dev
t0=$(date +%s)
timeout 480 python3 benchmarks/dev/gemv_kn_sweep.py "$out/small_m_sweep.json" --jobs 15 --dtypes float16 \
  --families reg,tile,splitk,swap --ms 1,2,4,8,16,32,64,128 > "$out/small_m_sweep.log" 2>&1
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "cuBLAS|BEST|compiled" "$out/small_m_sweep.log" | head -80
grep -c failed "$out/small_m_sweep.log"; grep failed "$out/small_m_sweep.log" | head -5 | cut -c1-300
