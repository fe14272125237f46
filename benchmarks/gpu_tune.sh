#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/gpu_tune.sh OUT_DIR STAGE   (Option B on the H200, issue 13)
#   STAGE=tune:  build benchmarks/tuned/tileship.toml (GEMM x 4 candidates + RMSNorm, sm_90a) on the host,
#                check the CUDA fast launcher (benchmarks/fast_launch_check.py), tileship tune
#   STAGE=serve: served_vs_best.py under both routing policies, runtime_overhead.py (fast launch), explain samples
#   STAGE=all:   both, in one call
# The release stays in /tmp/tuned-rel between the stages (a warm machine keeps /tmp).
set -u
out=${1:?usage: gpu_tune.sh OUT_DIR tune|serve}
stage=${2:?usage: gpu_tune.sh OUT_DIR tune|serve}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi-$stage.csv"
if [ "$stage" = tune ] || [ "$stage" = all ]; then
  t0=$(date +%s)
  python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j "${JOBS:-16}" \
    > "$out/build.log" 2>&1
  echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 "$out/build.log"
  rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
  TILESHIP_FAST_LAUNCH=cuda python3 benchmarks/fast_launch_check.py "$rel" > "$out/fast_launch_check.log" 2>&1
  fl=$?; echo "fast launch check rc=$fl"; tail -1 "$out/fast_launch_check.log"
  [ $fl = 0 ] && echo cuda > /tmp/tuned-fast-launch || echo off > /tmp/tuned-fast-launch
  t0=$(date +%s)
  # shellcheck disable=SC2086
  TILESHIP_FAST_LAUNCH=$(cat /tmp/tuned-fast-launch) python3 -m tileship.cli tune "$rel" ${TUNE_ARGS:---budget-ms 20} \
    > "$out/tune.log" 2>&1
  echo "tune rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 "$out/tune.log"
  cp "$rel/evidence/verification.json" "$out/verification.json"
  echo "$rel" > "$out/release_path.txt"
fi
if [ "$stage" = serve ] || [ "$stage" = all ]; then
  rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
  export TILESHIP_FAST_LAUNCH=$(cat /tmp/tuned-fast-launch 2>/dev/null)
  for routing in evidence pinned; do
    t0=$(date +%s)
    # shellcheck disable=SC2086
    python3 benchmarks/served_vs_best.py "$rel" --routing $routing --out "$out/served_vs_best_$routing.json" \
      ${SVB_ARGS:---budget-ms 15} > "$out/served_vs_best_$routing.txt" 2>&1
    echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/served_vs_best_$routing.txt"
  done
  python3 benchmarks/runtime_overhead.py --release "$rel" --device cuda --out "$out/runtime_overhead.json" \
    > "$out/runtime_overhead.txt" 2>&1; echo "runtime_overhead rc=$?"; tail -12 "$out/runtime_overhead.txt"
  for dims in "M=1 N=4096 K=4096" "M=16 N=11008 K=4096" "M=4096 N=4096 K=11008"; do
    # shellcheck disable=SC2086
    python3 -m tileship.cli explain "$rel" gemm $dims --dtype float16 >> "$out/explain.txt" 2>&1
  done
fi
# the device tool returns at most 8 files: everything also goes into one archive
tar -C "$out" -czf /tmp/gpu_tune_$stage.tgz . && mv /tmp/gpu_tune_$stage.tgz "$out/all_$stage.tgz"
