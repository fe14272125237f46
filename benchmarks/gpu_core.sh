#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/gpu_core.sh RELEASE_DIR OUT_DIR
# 1) load the CPU-built release with nvcc hidden and call every CUDA specialization;
# 2) runtime overhead and load-vs-JIT numbers.
set -u
rel=$1; out=$2
mkdir -p /tmp/site "$out" && tar -C /tmp/site -xJf .gpu/site.tar.xz
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/nvidia-smi.csv" 2>&1
PY=$(command -v python3)
PATH=/usr/bin:/bin "$PY" benchmarks/gpu_smoke.py --release "$rel" --out "$out/gpu_smoke.json" > "$out/gpu_smoke.txt" 2>&1; echo "smoke rc=$?"
tail -5 "$out/gpu_smoke.txt"
python3 benchmarks/runtime_overhead.py --release "$rel" --out "$out/runtime_overhead_h200.json" > "$out/runtime_overhead_h200.txt" 2>&1; echo "overhead rc=$?"
grep -v TileLang "$out/runtime_overhead_h200.txt" | tail -20
