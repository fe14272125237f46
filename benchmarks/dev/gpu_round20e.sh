#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round20e.sh OUT_DIR   (issue 16, round 20, call 5)
# The 4096^3 fp16 GEMM, binary HTTP, 64 clients, after the pool's change (finer size classes, a body waits for a
# block at the bound; issue 16: throughput at least 0.8x the in-process loop), then serve_shm's binary mode once.
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round20e.sh OUT_DIR}
d=/tmp/round20e; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
srel=$(ls -td /tmp/serve-shm-rel/*/ 2>/dev/null | head -1)
if [ -z "$srel" ]; then
  timeout 120 python3 -m tileship.cli build --project benchmarks/serve_shm/tileship.toml --out /tmp/serve-shm-rel \
    -j 16 > "$d/shm_build.log" 2>&1
  srel=$(ls -td /tmp/serve-shm-rel/*/ | head -1)
fi
t1=$(date +%s)
timeout 150 python3 benchmarks/serve_load.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --max-body-mib 256 --allow-unverified --clients 64 --duration 15 --max-requests 1500 --seq 40 \
  --out "$d/serve_load_gemm4096.json" > "$d/serve_load.log" 2>&1
echo "serve_load rc=$? ($(( $(date +%s) - t1 )) s)"; tail -6 "$d/serve_load.log" | cut -c1-260
t1=$(date +%s)
timeout 90 python3 benchmarks/serve_shm.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --allow-unverified --seq 40 --modes binary --out "$d/serve_shm_gemm4096.json" > "$d/serve_shm.log" 2>&1
echo "serve_shm rc=$? ($(( $(date +%s) - t1 )) s)"; tail -6 "$d/serve_shm.log" | cut -c1-260
echo "total $SECONDS s"
