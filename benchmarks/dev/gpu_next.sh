#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_next.sh OUT_DIR STAGE   (prepared on the CPU machine, not yet run)
# What the 2026-12-01 sessions left unmeasured, for the next session's device time (about 10 minutes):
#   STAGE=tune:  bash benchmarks/gpu_tune.sh DIR all: Option B tune + served_vs_best (evidence, pinned) +
#                runtime_overhead on the tuned release, with the dispatcher of 0eb4bfa/b315eee
#                (issues 13 and 14: 95% within 1.05x; the round-5 attempt was cut short by the budget)
#   STAGE=eager: the catalog release built here, then model_e2e.py in eager mode at decode batches 1 and 8
#                (issue 14: the eager tileship/PyTorch ratio at batch 1, 1.56 when last measured, target <= 1.0),
#                (E2E_ARGS=--serving-only: keep on PyTorch the layers whose kernels all serve the reference),
#                and benchmarks/dev/eager_profile.py (per-layer host time, swapped vs PyTorch; torch.profiler tables)
# Only OUT_DIR/all_STAGE.tgz comes back (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_next.sh OUT_DIR tune|eager}
stage=${2:?usage: gpu_next.sh OUT_DIR tune|eager}
d=/tmp/next_$stage; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all_$stage.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
if [ "$stage" = tune ]; then
  bash benchmarks/gpu_tune.sh "$d" all
else
  t0=$(date +%s)
  timeout 200 python3 -m tileship.cli build --out /tmp/catalog-rel -j 16 > "$d/build.log" 2>&1
  echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
  rel=$(ls -td /tmp/catalog-rel/*/ | head -1)
  timeout 150 python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" > "$d/verify.log" 2>&1
  echo "verify rc=$?"
  # shellcheck disable=SC2086
  PYTHONPATH=$PYTHONPATH:$PWD timeout $(( 570 - SECONDS )) python3 benchmarks/model_e2e.py --release "$rel" \
    --out "$d/model_e2e_eager.json" --modes eager --decode-batches 1,8 --require-evidence ${E2E_ARGS:-} > "$d/model_e2e_eager.log" 2>&1
  echo "model_e2e rc=$?"; grep -v "^  replaced\|^  kept" "$d/model_e2e_eager.log" | tail -12
  PYTHONPATH=$PYTHONPATH:$PWD timeout 120 python3 benchmarks/dev/eager_profile.py --release "$rel" --out "$d" \
    > "$d/eager_profile.log" 2>&1
  echo "eager_profile rc=$?"; grep -A9 "^release" "$d/eager_profile.log"
fi
