#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round25a.sh OUT_DIR   (issues 12 and 14; prepared in round 24, not yet run)
# The 16-bit MMA-GEMV for the decode linear (benchmarks/dev/linear_mv.py) beside F.linear (cuBLAS) and the
# catalog's kernel (linear_decode: the swapped-operand GEMM at M = 3..64) at M = 4, 8, 16 on the five Llama-3-8B
# projections. Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round25a.sh OUT_DIR}
d=/tmp/round25a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
(cd benchmarks/dev && timeout 500 python3 linear_mv.py "$d/linear_mv.json" --ms "${MS:-4,8,16}" --jobs 16 \
  > "$d/linear_mv.log" 2>&1)
echo "linear_mv rc=$?"; grep -E "^compiled|cuBLAS" "$d/linear_mv.log" | cut -c1-220
echo "total $SECONDS s"
