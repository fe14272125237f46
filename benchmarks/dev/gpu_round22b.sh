#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round22b.sh OUT_DIR   (issue 16, round 22)
# The 4096^3 fp16 GEMM, binary HTTP, 64 clients (target: at least 0.8x the in-process loop), with large bodies
# read on threads straight from the socket (serve.body_pull, the default --body-threads 8), then the same with
# --body-threads 0 (every body on the event loop, as in round 21: 0.720). Needs .gpu/site.tar.xz and
# .gpu/serve.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round22b.sh OUT_DIR}
d=/tmp/round22b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
t1=$(date +%s)
timeout 100 python3 -m tileship.cli build --project benchmarks/serve_shm/tileship.toml --out /tmp/serve-shm-rel \
  -j 16 > "$d/shm_build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t1 )) s)"
srel=$(ls -td /tmp/serve-shm-rel/*/ | head -1)
for mode in pull nopull; do
  extra=(); [ "$mode" = nopull ] && extra=(--server-arg=--body-threads=0)
  t1=$(date +%s)
  timeout 110 python3 benchmarks/serve_load.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
    --dtype float16 --max-body-mib 256 --allow-unverified --clients 64 --duration 12 --max-requests 800 --seq 20 \
    "${extra[@]}" --out "$d/serve_load_$mode.json" > "$d/serve_load_$mode.log" 2>&1
  echo "serve_load $mode rc=$? ($(( $(date +%s) - t1 )) s)"; tail -6 "$d/serve_load_$mode.log" | cut -c1-240
done
echo "total $SECONDS s"
