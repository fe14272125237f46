#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round20d.sh OUT_DIR   (issues 13 and 16, round 20, call 4)
# 1. Option B's whole loop again after the forced-slow canary's fix (option_b_loop.py --device cuda --rollback).
# 2. the front-end -> worker hop on the CPU release again (gpu_serve.sh ONLY="build_cpu workers"; issue 16: 100 us).
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. OUT_DIR/all.tgz and all_serve.tgz.
set -u
out=${1:?usage: gpu_round20d.sh OUT_DIR}
d=/tmp/round20d; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
t1=$(date +%s)
timeout 240 python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop --out "$d/loop.json" \
  > "$d/loop.log" 2>&1
echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "^\[(result|canary|load)" "$d/loop.log" | cut -c1-240
ONLY="build_cpu workers" BUDGET_S=150 bash benchmarks/dev/gpu_serve.sh "$out" 2>&1 | tail -4
python3 -c "import json; l = json.load(open('/tmp/gpu_serve/serve_workers.json'))['latency_us']
print('hop p50', l['hop_p50_us'], 'rounds', l['hop_rounds_us'], l['hop_verdict'])" 2>&1
echo "total $SECONDS s"
