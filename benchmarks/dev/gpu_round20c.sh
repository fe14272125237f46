#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round20c.sh OUT_DIR   (issues 14 and 16, round 20, call 3)
# 1. the eager Llama-style decoder at batch 1 on the tuned release (model_e2e.py, fp16 and bf16, 15 paired rounds;
#    issue 14: tileship/PyTorch at most 1.0): call 1's release when the machine is still warm, else built and tuned.
# 2. the front-end -> worker hop on the CPU release (gpu_serve.sh ONLY="build_cpu workers"; issue 16: 100 us).
# 3. the launch path (gpu_native.sh overhead: runtime_overhead.py --rounds 15; issue 14), with the time left.
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. All in OUT_DIR/all.tgz (+ all_serve.tgz, all_overhead.tgz).
set -u
out=${1:?usage: gpu_round20c.sh OUT_DIR}
d=/tmp/round20c; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
rel=$(ls -td /tmp/tuned-rel/*/ 2>/dev/null | head -1)
if [ -z "$rel" ]; then  # a warm machine keeps call 1's tuned release
  t0=$(date +%s)
  timeout 150 python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 \
    > "$d/build.log" 2>&1
  echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
  rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
  t1=$(date +%s)
  timeout 200 python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
  echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
else
  echo "tuned release from call 1: $rel"
fi
t1=$(date +%s)
PYTHONPATH=$PYTHONPATH:$PWD timeout 240 python3 benchmarks/model_e2e.py --release "$rel" \
  --out "$d/model_e2e_eager.json" --modes eager --decode-batches 1 --require-evidence --serving-only --iters 100 \
  --repeats 15 > "$d/model_e2e_eager.log" 2>&1
echo "model_e2e eager rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "paired" "$d/model_e2e_eager.log" | tail -6
left=$(( 470 - SECONDS ))
[ "$left" -gt 60 ] && ONLY="build_cpu workers" BUDGET_S=$(( left < 150 ? left : 150 )) bash benchmarks/dev/gpu_serve.sh "$out" \
  2>&1 | tail -8
left=$(( 585 - SECONDS ))
if [ "$left" -gt 100 ]; then
  timeout "$left" bash benchmarks/dev/gpu_native.sh "$d/native" overhead 2>&1 | tail -14
  cp "$d/native/all_overhead.tgz" "$out/" 2>/dev/null
else
  echo "no time for the launch path ($left s left)"
fi
xz -9 "$d/tune.log" 2>/dev/null
echo "total $SECONDS s"
