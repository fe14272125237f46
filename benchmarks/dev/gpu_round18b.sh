#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round18b.sh OUT_DIR   (issues 14 and 12, round 18, call 2)
# The Llama-style decoder (model_e2e.py: hidden 4096, intermediate 11008, 2 layers) with the TUNED release, whose
# GEMM candidates (the GEMV and the swapped-operand small-M GEMM) win tune at M=1-16 on exactly the model's
# projection shapes (4096x4096, 4096->11008, 11008->4096): build on the host, tileship tune (--clock latency), then
# model_e2e.py in eager mode at decode batches 1 and 8 (issue 14: tileship/PyTorch at batch 1 at most 1.0; the
# two models timed in turns, 9 rounds of 100 steps), then compile+graph with what time is left. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round18b.sh OUT_DIR}
d=/tmp/round18b; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
timeout "${BUILD_TIMEOUT:-120}" python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel \
  -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout "${TUNE_TIMEOUT:-260}" python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
cp "$rel/evidence/verification.json" "$d/verification.json" 2>/dev/null
export PYTHONPATH=$PYTHONPATH:$PWD
t1=$(date +%s)
timeout $(( ${EAGER_END:-480} - SECONDS )) python3 benchmarks/model_e2e.py --release "$rel" --out "$d/model_e2e_eager.json" \
  --modes eager --decode-batches 1,8 --require-evidence --serving-only --iters 100 --repeats 9 > "$d/model_e2e_eager.log" 2>&1
echo "model_e2e eager rc=$? ($(( $(date +%s) - t1 )) s)"; grep -v "^  replaced\|^  kept" "$d/model_e2e_eager.log" | tail -14
t1=$(date +%s)
timeout $(( 585 - SECONDS )) python3 benchmarks/model_e2e.py --release "$rel" --out "$d/model_e2e_graph.json" \
  --modes compile+graph --dtypes float16 --decode-batches 1,8 --require-evidence --serving-only > "$d/model_e2e_graph.log" 2>&1
echo "model_e2e compile+graph rc=$? ($(( $(date +%s) - t1 )) s)"; grep -v "^  replaced\|^  kept" "$d/model_e2e_graph.log" | tail -8
xz -9 "$d/verification.json" "$d/tune.log" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
