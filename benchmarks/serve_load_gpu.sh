#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/serve_load_gpu.sh RELEASE_DIR OUT_DIR
# `tileship serve` under load on the H200: a 4096x4096x4096 fp16 GEMM with binary tensors
# (64 MiB request, 32 MiB response), 64 clients; then a small GEMM (M=16, still a 32 MiB B per request).
# nvcc is hidden from PATH: nothing may compile.
# RELEASE_DIR: a CPU-built release holding the gemm operator (cuda-sm90a). Writes OUT_DIR/serve_load_*.json + .txt.
set -u
rel=$1; out=$2
mkdir -p /tmp/site "$out" && tar -C /tmp/site -xJf .gpu/site.tar.xz
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
PY=$(command -v python3)
"$PY" -c "import httptools" 2>/dev/null && echo "http parser: httptools" || echo "http parser: h11 (add httptools to the bundle for ~2-3x faster bodies)"
run() {  # name, then serve_load.py arguments
  name=$1; shift
  PATH=/usr/bin:/bin "$PY" benchmarks/serve_load.py --release "$rel" --out "$out/serve_load_$name.json" "$@" > "$out/serve_load_$name.txt" 2>&1
  echo "$name rc=$?"; tail -9 "$out/serve_load_$name.txt"
}
run gemm4096_fp16 --op gemm --dims M=4096,N=4096,K=4096 --dtype float16 --max-body-mib 256 --allow-unverified \
    --clients 64 --duration 20 --max-requests 2000 --seq 50
run gemm16_fp16 --op gemm --dims M=16,N=4096,K=4096 --dtype float16 --max-body-mib 256 --allow-unverified \
    --clients 64 --duration 10 --max-requests 4000 --seq 100
