#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round16b.sh OUT_DIR   (issue 13, round 16, call 5)
# The tuned GEMM project with the GEMV-style candidate (catalog/gemv_kn.py) and tune's triage: build
# on the host, tileship tune (--clock latency), then served_vs_best.py --routing pinned and --routing evidence (that order: pinned first).
set -u
out=${1:?usage: gpu_round16b.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
timeout ${BUILD_TIMEOUT:-120} python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 \
  > "$out/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout ${TUNE_TIMEOUT:-240} python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency ${TUNE_ARGS:-} > "$out/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$out/tune.log"
cp "$rel/evidence/verification.json" "$out/verification.json" 2>/dev/null
for routing in pinned evidence; do
  t1=$(date +%s)
  timeout ${SVB_TIMEOUT:-150} python3 benchmarks/served_vs_best.py "$rel" --routing $routing --out "$out/served_vs_best_$routing.json" \
    --budget-ms 15 > "$out/served_vs_best_$routing.txt" 2>&1
  echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$out/served_vs_best_$routing.txt"
done
echo "total $(( $(date +%s) - t0 )) s"
tar -C "$out" -czf /tmp/all.tgz . && mv /tmp/all.tgz "$out/all.tgz"
