#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round15.sh OUT_DIR   (issue 13, round 15)
# 1. build benchmarks/tuned/tileship.toml on the host (GEMM x 4 candidates + RMSNorm, sm_90a);
# 2. benchmarks/dev/clock_methods.py: five timing methods x every path, side by side (which clock do
#    tune and served_vs_best read?), before anything is tuned;
# 3. tileship tune (its dispatchers now get the release's compiled table), then served_vs_best.py under
#    evidence and pinned routing, as benchmarks/gpu_tune.sh does.
# Everything is also packed into all.tgz (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_round15.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
timeout 200 python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 \
  > "$out/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout 150 python3 benchmarks/dev/clock_methods.py "$rel" "$out/clock_methods.json" --rounds 5 > "$out/clock_methods.txt" 2>&1
echo "clock_methods rc=$? ($(( $(date +%s) - t1 )) s)"
t1=$(date +%s)
timeout 150 python3 -m tileship.cli tune "$rel" --budget-ms 20 > "$out/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$out/tune.log"
cp "$rel/evidence/verification.json" "$out/verification.json" 2>/dev/null
for routing in evidence pinned; do
  t1=$(date +%s)
  timeout 110 python3 benchmarks/served_vs_best.py "$rel" --routing $routing --out "$out/served_vs_best_$routing.json" \
    --budget-ms 15 > "$out/served_vs_best_$routing.txt" 2>&1
  echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$out/served_vs_best_$routing.txt"
done
echo "total $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> "$out/nvidia-smi.csv" 2>&1
tar -C "$out" -czf /tmp/all.tgz . && mv /tmp/all.tgz "$out/all.tgz"
