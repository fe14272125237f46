#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round23a.sh OUT_DIR   (issue 16; prepared in round 22, not yet run)
# The 64-client throughput target (at least 0.8x the in-process loop) in interleaved rounds
# (benchmarks/serve_load_rounds.py: each round the in-process loop, then the HTTP load; ROUNDS=6, the server's calls on
# THREADS=1 worker threads), because round 22's
# in-process loop alone ran at 21.4-30.4 calls/s across four runs. Needs .gpu/site.tar.xz and .gpu/serve.tar.xz.
set -u
out=${1:?usage: gpu_round23a.sh OUT_DIR}
d=/tmp/round23a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
t1=$(date +%s)
srel=$(ls -td /tmp/serve-shm-rel/*/ 2>/dev/null | head -1)
if [ -z "$srel" ]; then
  timeout 100 python3 -m tileship.cli build --project benchmarks/serve_shm/tileship.toml --out /tmp/serve-shm-rel \
    -j 16 > "$d/shm_build.log" 2>&1
  echo "build rc=$? ($(( $(date +%s) - t1 )) s)"
  srel=$(ls -td /tmp/serve-shm-rel/*/ | head -1)
fi
t1=$(date +%s)
timeout 200 python3 benchmarks/serve_load_rounds.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --max-body-mib 256 --allow-unverified --clients 64 --rounds "${ROUNDS:-6}" --seconds 8 --calls 12 \
  --threads "${THREADS:-1}" --out "$d/serve_load_rounds.json" > "$d/serve_load_rounds.log" 2>&1
echo "serve_load_rounds rc=$? ($(( $(date +%s) - t1 )) s)"; tail -8 "$d/serve_load_rounds.log" | cut -c1-200
echo "total $SECONDS s"
