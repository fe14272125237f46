#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round19d.sh OUT_DIR   (issue 14, round 19, call 5)
# The launch path after the dispatcher's grad-mode check (0efc44d): gpu_native.sh's overhead stage (launch project,
# fast_launch_check.py, runtime_overhead.py --rounds 15); then the tuned project built and tuned on the host and the
# eager Llama-style decoder at batch 1 (model_e2e.py, fp16 and bf16, 15 paired rounds). Everything in OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round19d.sh OUT_DIR}
d=/tmp/round19d; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
bash benchmarks/dev/gpu_native.sh "$d/native" overhead
cp "$d/native/all_overhead.tgz" "$out/" 2>/dev/null  # back even if a later step runs past the limit
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
timeout 150 python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 \
  > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout 200 python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
export PYTHONPATH=$PYTHONPATH:$PWD
left=$(( ${EAGER_END:-400} - SECONDS ))
t1=$(date +%s)
timeout "$left" python3 benchmarks/model_e2e.py --release "$rel" --out "$d/model_e2e_eager.json" --modes eager \
  --decode-batches 1 --require-evidence --serving-only --iters 100 --repeats 15 > "$d/model_e2e_eager.log" 2>&1
echo "model_e2e eager rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "paired" "$d/model_e2e_eager.log" | tail -6
xz -9 "$d/tune.log" 2>/dev/null
echo "total $SECONDS s"
