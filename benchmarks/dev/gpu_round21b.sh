#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round21b.sh OUT_DIR   (issues 13 and 16, round 21, call 2)
# 1. Option B's loop with the forced-slow canary again, the canary now comparing CUDA-event time around the call
#    (device_ms; call 1's canary compared launch + wait: 0.2545 vs 0.2865 ms, 1.13x, promoted under 1.25x).
# 2. a 64 MiB body into the server: raw recv_into, tileship (the protocol's sink), tileship without the sink.
# 3. the 4096^3 fp16 GEMM, binary HTTP, 64 clients, with the sink and off-loop pinning, py-spy over the load.
# 4. serve_shm's binary mode, 1 client.
# Needs .gpu/site.tar.xz, .gpu/serve.tar.xz and .gpu/pyspy.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round21b.sh OUT_DIR}
d=/tmp/round21b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
[ -x /tmp/pyspy/py-spy ] || { mkdir -p /tmp/pyspy && tar -C /tmp/pyspy -xJf .gpu/pyspy.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH PY_SPY=/tmp/pyspy/py-spy
t1=$(date +%s)
rm -rf /tmp/loop
timeout 240 python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop --out "$d/loop.json" \
  > "$d/loop.log" 2>&1
echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "^\[(result|canary|load)" "$d/loop.log" | cut -c1-240
python3 -c "import json; d = json.load(open('$d/loop.json'))
for k in ('canary', 'rollback'):
    for x in (d.get(k) or {}).get('decisions', [])[-1:]:
        print(k, x['action'], json.dumps(x['numbers']['models'])[:300])" 2>&1
t1=$(date +%s)
timeout 120 python3 benchmarks/dev/body_rx.py --mib 64 --rounds 15 --out "$d/body_rx.json" > "$d/body_rx.log" 2>&1
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
  --profile-load "$d/serve_load_spy.txt" --out "$d/serve_load_gemm4096.json" > "$d/serve_load.log" 2>&1
echo "serve_load rc=$? ($(( $(date +%s) - t1 )) s)"; tail -6 "$d/serve_load.log" | cut -c1-260
[ -s "$d/serve_load_spy.txt" ] && python3 benchmarks/dev/spy_summary.py "$d/serve_load_spy.txt" --top 25 \
  > "$d/serve_load_spy_summary.txt" 2>&1 && head -34 "$d/serve_load_spy_summary.txt" | cut -c1-200
t1=$(date +%s)
timeout 90 python3 benchmarks/serve_shm.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --allow-unverified --seq 40 --modes binary --out "$d/serve_shm_gemm4096.json" > "$d/serve_shm.log" 2>&1
echo "serve_shm rc=$? ($(( $(date +%s) - t1 )) s)"; tail -6 "$d/serve_shm.log" | cut -c1-260
echo "total $SECONDS s"
