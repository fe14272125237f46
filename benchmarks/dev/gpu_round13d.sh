#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round13d.sh OUT_DIR
# A control for the paired eager ratio (issue 14): bf16 decode B=1, first as in round 13c (serving_only swaps the
# five RMSNorms, which serve their kernel), then with the norms pointed at an operator that has no bf16
# specialization (--names rmsnorm=rmsnorm_cpu: nothing swapped, torch against torch), where the paired ratio
# should straddle 1. OUT_DIR/round13d.tgz.
set -u
out=${1:?usage: gpu_round13d.sh OUT_DIR}
d=/tmp/round13d; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/round13d.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
timeout 100 python3 -m tileship.cli build --out /tmp/catalog-rel -j 16 > "$d/build.log" 2>&1
echo "build rc=$?"; rel=$(ls -td /tmp/catalog-rel/*/ | head -1)
timeout 80 python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" > "$d/verify.log" 2>&1
echo "verify rc=$?"
for run in norms_swapped:'' nothing_swapped:'--names rmsnorm=rmsnorm_cpu'; do
  # shellcheck disable=SC2086
  PYTHONPATH=$PYTHONPATH:$PWD timeout 60 python3 benchmarks/model_e2e.py --release "$rel" --out "$d/${run%%:*}.json" \
    --dtypes bfloat16 --modes eager --decode-batches 1 --prefill-seq 16 --serving-only --iters 100 --repeats 9 \
    ${run#*:} > "$d/${run%%:*}.log" 2>&1
  echo "${run%%:*} rc=$?"; grep -E "decode_b1|replaced$" "$d/${run%%:*}.log" | grep -v "^  "
done
