#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_shm.sh OUT_DIR RELEASE_DIR [DRILL_RELEASE]  (issue 16, one call <= ~540 s)
#   1. tests/test_serve_cuda_shm_gpu.py: Triton's CUDA shared memory with tritonclient's own cuda_shared_memory
#      helpers against `tileship serve` (round trips, hostile registrations and windows)
#   2. benchmarks/serve_shm.py: the 4096^3 fp16 GEMM by binary HTTP, system shm and CUDA shm vs in-process
#   3. benchmarks/serve_load.py: the same GEMM, binary HTTP, 64 clients (throughput vs the in-process loop)
#   4. the rollback drill (benchmarks/gpu_drill.sh, FAULT=0) with the warm rollback standby, then with
#      --no-warm-rollback, side by side on the same release pair
# RELEASE_DIR: a release of benchmarks/serve_shm/tileship.toml (the catalog GEMM, cuda-sm90a), built on the CPU machine.
# DRILL_RELEASE (default RELEASE_DIR): the drills' release; benchmarks/launch/tileship.toml (add, RMSNorm) keeps each
# request small, so "first answer from the new state" measures the switch, not a 32 MiB request.
# STEPS (default: all, in this order): ipc cuda_shm_tests serve_shm drill_warm drill_cold drill_serial serve_load
# (drill_cold: --no-warm-rollback; drill_serial: that and --warmup-threads=1, warm-up one specialization at a time)
# Needs: .gpu/serve.tar.xz (bash benchmarks/dev/serve_host_bundle.sh: server, tritonclient, cuda-bindings) and
# TileLang already unpacked in /tmp/site by the call just before (the two bundles do not fit one call's 64 MiB).
# Only OUT_DIR/all_shm.tgz comes back.
set -u
out=${1:?usage: gpu_shm.sh OUT_DIR RELEASE_DIR}; rel=${2:?usage: gpu_shm.sh OUT_DIR RELEASE_DIR}; drel=${3:-$rel}
STEPS=" ${STEPS:-ipc cuda_shm_tests serve_shm drill_warm drill_cold drill_serial serve_load} "
BUDGET_S=${BUDGET_S:-540}
d=/tmp/gpu_shm; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { echo "total ${SECONDS} s" | tee -a "$d/steps.txt"; tar -C "$d" -czf "$out/all_shm.tgz" .; }
trap finish EXIT
rm -rf /tmp/serve && mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz || exit 2
[ -d /tmp/site/tilelang ] || { echo "gpu_shm: no /tmp/site/tilelang: unpack .gpu/site.tar.xz in a call just before"; exit 3; }
export PYTHONPATH=/tmp/serve:/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache TILESHIP_HOME=$d/home TMPDIR=$d/tmp
mkdir -p "$TMPDIR"
PY=python3
git log -1 --format='code %h %s' > "$d/code.txt" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,temperature.gpu --format=csv > "$d/nvidia-smi.csv" 2>&1
"$PY" -c "import cuda.bindings, tritonclient, torch; print('cuda-bindings', cuda.bindings.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" > "$d/env.txt" 2>&1
cat "$d/env.txt"

step() {  # NAME MAX_S CMD...: under timeout, cut to what is left of the budget; log in $d/NAME.log
  local name=$1 max=$2; shift 2
  [[ "$STEPS" == *" $name "* ]] || { echo "$name: SKIPPED (not in STEPS)" | tee -a "$d/steps.txt"; return 0; }
  local left=$(( BUDGET_S - SECONDS )) t0=$SECONDS rc
  local lim=$(( max < left ? max : left ))
  if [ "$lim" -lt 20 ]; then echo "$name: SKIPPED (${left} s left)" | tee -a "$d/steps.txt"; return 0; fi
  timeout -k 10 "$lim" "$@" > "$d/$name.log" 2>&1; rc=$?
  echo "$name: rc=$rc $(( SECONDS - t0 )) s (limit $lim)" | tee -a "$d/steps.txt"
  tail -n 14 "$d/$name.log"
  return $rc
}

step ipc 60 "$PY" -m pytest -m gpu tests/test_cuda_ipc_gpu.py -q -p no:cacheprovider --tb=long --basetemp "$d/pytest_ipc"
step cuda_shm_tests 150 "$PY" -m pytest -m gpu tests/test_serve_cuda_shm_gpu.py -q -p no:cacheprovider -rs \
  --basetemp "$d/pytest"
step serve_shm 120 "$PY" benchmarks/serve_shm.py --release "$rel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --allow-unverified --seq 60 --out "$d/serve_shm_gemm4096.json"
step drill_warm 110 env FAULT=0 PHASE_SECONDS=${PHASE_SECONDS:-6} CONCURRENCY=${CONCURRENCY:-4} bash benchmarks/gpu_drill.sh "$d/drill_warm" "$drel"
step drill_cold 110 env FAULT=0 PHASE_SECONDS=${PHASE_SECONDS:-6} CONCURRENCY=${CONCURRENCY:-4} SERVER_ARG=--no-warm-rollback \
  bash benchmarks/gpu_drill.sh "$d/drill_cold" "$drel"
step drill_serial 110 env FAULT=0 PHASE_SECONDS=${PHASE_SECONDS:-6} CONCURRENCY=${CONCURRENCY:-4} \
  SERVER_ARG="--no-warm-rollback --warmup-threads=1" bash benchmarks/gpu_drill.sh "$d/drill_serial" "$drel"
step serve_load 120 "$PY" benchmarks/serve_load.py --release "$rel" --op gemm --dims M=4096,N=4096,K=4096 \
  --dtype float16 --max-body-mib 256 --allow-unverified --clients 64 --duration 15 --max-requests 1500 --seq 40 \
  --out "$d/serve_load_gemm4096.json"
cat "$d/steps.txt"
