#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round21a.sh OUT_DIR   (issues 13 and 16, round 21, call 1)
# 1. Option B's whole loop with the forced-slow canary, now that the canary compares the operator's own time
#    (option_b_loop.py --device cuda --rollback; issue 13).
# 2. the front-end -> worker hop with the worker and the loop polling (--worker-spin-us/--loop-spin-us), beside a
#    server with both at 0 (gpu_serve.sh ONLY="build_cpu workers"; issue 16: 100 us).
# 3. the 4096^3 fp16 GEMM, binary HTTP, 64 clients, with py-spy sampling the server during the load (issue 16: 0.8x).
# Needs .gpu/site.tar.xz, .gpu/serve.tar.xz and .gpu/pyspy.tar.xz carried. OUT_DIR/all.tgz and all_serve.tgz.
set -u
out=${1:?usage: gpu_round21a.sh OUT_DIR}
d=/tmp/round21a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
[ -x /tmp/pyspy/py-spy ] || { mkdir -p /tmp/pyspy && tar -C /tmp/pyspy -xJf .gpu/pyspy.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH PY_SPY=/tmp/pyspy/py-spy
echo "uid $(id -u), ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)" | tee "$d/host_user.txt"
t1=$(date +%s)
timeout 240 python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop --out "$d/loop.json" \
  > "$d/loop.log" 2>&1
echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "^\[(result|canary|load)" "$d/loop.log" | cut -c1-240
ONLY="build_cpu workers" BUDGET_S=170 bash benchmarks/dev/gpu_serve.sh "$out" 2>&1 | tail -4
python3 -c "import json; l = json.load(open('/tmp/gpu_serve/serve_workers.json'))['latency_us']
print('hop p50', l['hop_p50_us'], 'rounds', l['hop_rounds_us'], l['hop_verdict'])
print('no-spin hop p50', l.get('nospin_hop_p50_us'), 'rounds', l.get('nospin_hop_rounds_us'), l.get('nospin_hop_verdict'))
print('spin - nospin by round', l.get('spin_minus_nospin_rounds_us'))" 2>&1
cp /tmp/gpu_serve/serve_workers.json "$d/" 2>/dev/null
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
python3 -c "import json; print(json.load(open('$d/serve_load_gemm4096.json'))['http_load'].get('profile'))" 2>&1 | cut -c1-400
[ -s "$d/serve_load_spy.txt" ] && python3 benchmarks/dev/spy_summary.py "$d/serve_load_spy.txt" --top 25 \
  > "$d/serve_load_spy_summary.txt" 2>&1 && head -45 "$d/serve_load_spy_summary.txt" | cut -c1-200
echo "total $SECONDS s"
