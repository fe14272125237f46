#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round19a.sh OUT_DIR   (issues 13 and 14, round 19, call 1)
# Option B at this tree with tune's sign rule (verify/tune_rule.py, SIGN_ROUNDS/SIGN_MARGIN): build the tuned
# project on the host, tileship tune (--clock latency), served_vs_best.py --routing pinned then evidence; then
# the eager Llama-style decoder on that release (model_e2e.py, decode batch 1, fp16 and bf16, 15 paired rounds);
# then, with the time left, Option B's whole loop (option_b_loop.py --device cuda). Everything in OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round19a.sh OUT_DIR}
d=/tmp/round19a; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
timeout "${BUILD_TIMEOUT:-150}" python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel \
  -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout "${TUNE_TIMEOUT:-240}" python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
cp "$rel/evidence/verification.json" "$d/verification.json" 2>/dev/null
for routing in pinned evidence; do
  t1=$(date +%s)
  timeout "${SVB_TIMEOUT:-150}" python3 benchmarks/served_vs_best.py "$rel" --routing $routing \
    --out "$d/served_vs_best_$routing.json" --budget-ms 15 > "$d/served_vs_best_$routing.txt" 2>&1
  echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$d/served_vs_best_$routing.txt"
done
export PYTHONPATH=$PYTHONPATH:$PWD
left=$(( 545 - SECONDS ))
if [ "$left" -gt 40 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/model_e2e.py --release "$rel" --out "$d/model_e2e_eager.json" --modes eager \
    --decode-batches 1 --require-evidence --serving-only --iters 100 --repeats 15 > "$d/model_e2e_eager.log" 2>&1
  echo "model_e2e eager rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "paired" "$d/model_e2e_eager.log" | tail -6
fi
left=$(( 585 - SECONDS ))
if [ "$left" -gt 70 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/option_b_loop.py --device cuda --workdir /tmp/loop --out "$d/loop.json" \
    > "$d/loop.log" 2>&1
  echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; tail -4 "$d/loop.log"
else
  echo "no time for option_b_loop ($left s left)"
fi
xz -9 "$d/verification.json" "$d/tune.log" "$d"/served_vs_best_*.json 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
