#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round20b.sh OUT_DIR   (issues 13 and 16, round 20, call 2)
# 1. dev/body_rx.py: a 64 MiB body into the server, by server variant (the floor: recv_into), 15 rounds.
# 2. serve_load.py: the 4096^3 fp16 GEMM, binary HTTP, 64 clients, after the client fix (issue 16: at least 0.8x
#    the in-process loop's throughput). The release of call 1 when the machine is still warm, else built again.
# 3. Option B's whole loop at this tree (option_b_loop.py --device cuda --rollback), with the time left.
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. All in OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round20b.sh OUT_DIR}
d=/tmp/round20b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
t1=$(date +%s)
timeout 90 python3 benchmarks/dev/body_rx.py --mib 64 --rounds 15 --out "$d/body_rx.json" > "$d/body_rx.log" 2>&1
echo "body_rx rc=$? ($(( $(date +%s) - t1 )) s)"; cat "$d/body_rx.log"
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
echo "serve_load rc=$? ($(( $(date +%s) - t1 )) s)"; tail -8 "$d/serve_load.log" | cut -c1-260
left=$(( 585 - SECONDS ))
if [ "$left" -gt 90 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop \
    --out "$d/loop.json" > "$d/loop.log" 2>&1
  echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; tail -12 "$d/loop.log" | cut -c1-300
else
  echo "no time for option_b_loop ($left s left)"
fi
echo "total ${SECONDS} s"
