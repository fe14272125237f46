#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_native.sh OUT_DIR STAGE   (issues 13 and 14: the compiled dispatch table)
#   STAGE=launch: build benchmarks/launch/tileship.toml here (CUDA add + RMSNorm; the build compiles the table,
#                 runtime/native/fastcall.c, with this host's C compiler), fast_launch_check.py (the table's answers
#                 checked), runtime_overhead.py with 15 rounds (kernel = the table, kernel (python) = the same
#                 kernel through the Python dispatcher, floor = the tvm-ffi entry called directly, torch);
#                 then gpu_tune.sh's tune stage (build the tuned project, check, tileship tune)
#   STAGE=overhead: the launch stage without the tuned project
#   STAGE=serve:  gpu_tune.sh's serve stage on that release (served_vs_best under both routings,
#                 runtime_overhead, explain): needs the same warm machine (/tmp/tuned-rel)
#   STAGE=eager:  gpu_next.sh's eager stage (catalog build, model_e2e.py --modes eager, eager_profile.py)
# Only OUT_DIR/all_STAGE.tgz comes back (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_native.sh OUT_DIR launch|overhead|serve|eager}
stage=${2:?usage: gpu_native.sh OUT_DIR launch|overhead|serve|eager}
d=/tmp/native_$stage; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all_$stage.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
git log --oneline -1 > "$d/tree.txt" 2>/dev/null || true
if [ "$stage" = launch ] || [ "$stage" = overhead ]; then
  t0=$(date +%s)
  timeout 150 python3 -m tileship.cli build --project benchmarks/launch/tileship.toml --out /tmp/launch-rel -j 16 \
    > "$d/launch_build.log" 2>&1
  echo "launch build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/launch_build.log"
  rel=$(ls -td /tmp/launch-rel/*/ | head -1)
  python3 -c "import json,sys; print('native:', json.load(open(sys.argv[1]+'/release.json')).get('native'))" "$rel"
  timeout 90 python3 benchmarks/fast_launch_check.py "$rel" > "$d/launch_fast_launch_check.log" 2>&1
  echo "fast launch check rc=$?"; grep -c "table calls=1" "$d/launch_fast_launch_check.log"; tail -1 "$d/launch_fast_launch_check.log"
  timeout 200 python3 benchmarks/runtime_overhead.py --release "$rel" --device cuda --rounds 15 \
    --out "$d/launch_runtime_overhead.json" > "$d/launch_runtime_overhead.txt" 2>&1
  echo "runtime_overhead rc=$?"; grep -v "^ *$" "$d/launch_runtime_overhead.txt" | tail -24
  if [ "$stage" = launch ]; then bash benchmarks/gpu_tune.sh "$d/tuned" tune; fi
elif [ "$stage" = serve ]; then
  bash benchmarks/gpu_tune.sh "$d/tuned" serve
else
  bash benchmarks/dev/gpu_next.sh "$d/eager" eager
fi
