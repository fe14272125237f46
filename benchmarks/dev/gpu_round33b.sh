#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round33b.sh OUT_DIR   (issue 16, round 33)
# The 64-client throughput target (HTTP at least 0.8x the in-process loop, 4096^3 fp16 GEMM over binary HTTP) in
# interleaved rounds (serve_load_rounds.py) with the server's calls on THREADS worker threads (default 4; rounds 23-32
# ran 1), then the same with 1 in the same call, so that both sit on one warm host. Needs .gpu/site.tar.xz and
# .gpu/serve.tar.xz. OUT_DIR/rounds.tgz.
set -u
out=${1:?usage: gpu_round33b.sh OUT_DIR}
d=/tmp/round33b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/rounds.tgz" .; }
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
for th in "${THREADS:-4}" 1; do
  t1=$(date +%s)
  timeout "${ROUNDS_TIMEOUT:-150}" python3 benchmarks/serve_load_rounds.py --release "$srel" --op gemm \
    --dims M=4096,N=4096,K=4096 --dtype float16 --max-body-mib 256 --allow-unverified --clients 64 \
    --rounds "${ROUNDS:-6}" --seconds 8 --calls 12 --threads "$th" --out "$d/rounds_threads$th.json" \
    > "$d/rounds_threads$th.log" 2>&1
  echo "threads $th rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "^round|^HTTP" "$d/rounds_threads$th.log" | cut -c1-200
done
echo "total $SECONDS s"
