#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round17b.sh OUT_DIR   (issue 12 item 3, round 17, call 4)
# The swapped-operand small-M GEMM (catalog/gemm_small_m.py) at Llama-3-8B's decode projections (qkv 4096->6144,
# o 4096->4096, gate+up 4096->28672, down 14336->4096, lm_head 4096->128256), fp16, M 1..32, against both
# cuBLAS forms (torch.matmul on [K, N] and F.linear on [N, K]); kernels alone (CUDA events after an L2 flush).
set -u
out=${1:?usage: gpu_round17b.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/dev
t0=$(date +%s)
timeout ${SWEEP_TIMEOUT:-300} python3 benchmarks/dev/gemv_kn_sweep.py "$out/llama_swap_sweep.json" --jobs 15 \
  --dtypes float16 --families swap --shapes 4096x4096,qkv,gate_up,down,lm_head --ms 1,2,4,8,16,32 \
  > "$out/llama_swap_sweep.log" 2>&1
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "cuBLAS|BEST|compiled" "$out/llama_swap_sweep.log" | head -80
grep -c failed "$out/llama_swap_sweep.log"; grep failed "$out/llama_swap_sweep.log" | head -5 | cut -c1-300
xz -k -9 "$out/llama_swap_sweep.json" 2>/dev/null; rm -f "$out/llama_swap_sweep.json"
