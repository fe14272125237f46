#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round18d.sh OUT_DIR   (issue 14, round 18, call 3)
# Is call 2's eager result stable? The tuned release built and tuned again on a fresh host (as gpu_round18b.sh), then
# model_e2e.py in eager mode at decode batches 1 and 8 twice in a row (runs A and B, the same arguments as call 2).
set -u
out=${1:?usage: gpu_round18d.sh OUT_DIR}
d=/tmp/round18d; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
timeout 120 python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($SECONDS s)"; tail -1 "$d/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
timeout 240 python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($SECONDS s)"; tail -1 "$d/tune.log"
cp "$rel/evidence/verification.json" "$d/verification.json" 2>/dev/null
export PYTHONPATH=$PYTHONPATH:$PWD
for run in A B; do
  left=$(( 560 - SECONDS )); [ "$left" -lt 50 ] && { echo "no time for run $run"; break; }
  timeout "$left" python3 benchmarks/model_e2e.py --release "$rel" --out "$d/model_e2e_eager_$run.json" --modes eager \
    --decode-batches 1,8 --require-evidence --serving-only --iters 100 --repeats 9 > "$d/model_e2e_eager_$run.log" 2>&1
  echo "model_e2e eager run $run rc=$? ($SECONDS s)"; grep -E "paired" "$d/model_e2e_eager_$run.log" | cut -c1-200
done
xz -9 "$d/verification.json" "$d/tune.log" 2>/dev/null
