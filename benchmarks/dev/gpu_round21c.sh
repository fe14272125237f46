#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round21c.sh OUT_DIR   (issue 13, round 21, call 3)
# Option B at this tree: build the tuned project on the host, tileship tune (--clock latency), served_vs_best.py
# --routing pinned then evidence, in this one call (target: both >= 118/124 within 1.05x, worst <= 1.15, 0 compiles).
# Needs .gpu/site.tar.xz carried. All in OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round21c.sh OUT_DIR}
d=/tmp/round21c; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rel=$(ls -td /tmp/tuned-rel/*/ 2>/dev/null | head -1)
if [ -z "$rel" ]; then
  timeout "${BUILD_TIMEOUT:-150}" python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml \
    --out /tmp/tuned-rel -j 16 > "$d/build.log" 2>&1
  echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
  rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
fi
t1=$(date +%s)
timeout "${TUNE_TIMEOUT:-240}" python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
cp "$rel/evidence/verification.json" "$d/verification.json" 2>/dev/null
for routing in pinned evidence; do
  t1=$(date +%s)
  left=$(( 585 - SECONDS ))
  [ "$left" -gt 160 ] && left=160
  timeout "$left" python3 benchmarks/served_vs_best.py "$rel" --routing $routing \
    --out "$d/served_vs_best_$routing.json" --budget-ms 15 > "$d/served_vs_best_$routing.txt" 2>&1
  echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$d/served_vs_best_$routing.txt"
done
xz -9 "$d/verification.json" "$d/tune.log" "$d"/served_vs_best_*.json 2>/dev/null
echo "total ${SECONDS} s"
