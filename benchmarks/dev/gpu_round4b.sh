#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round4b.sh OUT_DIR TOOLCHAIN_RELEASE_DIR
# 1) issue 18's toolchain smoke (gpu_smoke.py with every CUDA directory taken off PATH: no nvcc can run)
# 2) benchmarks/dev/gemv_sweep.py: catalog/gemv.py's block shapes vs cuBLAS (fp16, M 1/4/8), before the
#    decode project is verified with it
# Only OUT_DIR/all.tgz comes back.
set -u
out=${1:?usage: gpu_round4b.sh OUT_DIR TOOLCHAIN_RELEASE_DIR}
d=/tmp/round4b; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
nocuda=$(echo "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)
PATH=$nocuda command -v nvcc > "$d/nvcc_visible.txt" 2>&1; echo "nvcc on the smoke's PATH: '$(cat "$d/nvcc_visible.txt")'"
PATH=$nocuda timeout 120 python3 benchmarks/gpu_smoke.py --release "${2:?}" --out "$d/toolchain_smoke.json" \
  > "$d/toolchain_smoke.log" 2>&1
echo "toolchain smoke rc=$?"; tail -3 "$d/toolchain_smoke.log"
timeout $(( 290 - SECONDS )) python3 benchmarks/dev/gemv_sweep.py "$d/gemv_sweep.json" --jobs 15 > "$d/gemv_sweep.log" 2>&1
echo "gemv_sweep rc=$?"; grep -v TileLang "$d/gemv_sweep.log" | tail -150
