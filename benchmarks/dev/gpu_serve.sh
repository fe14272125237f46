#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_serve.sh OUT_DIR   (prepared and run end to end on the CPU machine first)
# The serving targets that need a quiet machine or the H200, in one call of at most ~300 s:
#   issue 15: gRPC (and HTTP) p50 overhead over the in-process call at small shapes, with the bare grpc.aio echo
#             floor measured in the same run (CPU "c" release: add N=4096, RMSNorm M=1; on the GPU also a CUDA op:
#             fault_copy N=4096, a plain copy kernel);
#   issue 16: the front-end -> worker hop (`--workers 1` vs `--workers 0`, target 100 us), kill -9 of the serving
#             worker under load (time to the next success, failed requests), and the sticky CUDA fault through the
#             server itself with benchmarks/fault_kernel.py (target: serving again under 1 s with the standby).
# Needs: .gpu/serve.tar.xz (bash benchmarks/dev/serve_host_bundle.sh) unless python3 already has the server and
# clients; TileLang (PYTHONPATH=/tmp/site:... from an earlier call, or .gpu/site.tar.xz, via benchmarks/gpu_env.sh).
# Steps run in priority order, each under `timeout`, cut to what is left of ~285 s; a step that no longer fits is
# skipped with a line saying so. GPU-only steps are skipped, with the reason, when torch sees no GPU.
# Only OUT_DIR/all_serve.tgz comes back (the device tool returns at most 8 files).
# ONLY="failover ..." runs just the steps named (the fault release is built either way).
set -u
out=${1:?usage: gpu_serve.sh OUT_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-285}
d=/tmp/gpu_serve; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { echo "total ${SECONDS} s" | tee -a "$d/steps.txt"; tar -C "$d" -czf "$out/all_serve.tgz" .; }
trap finish EXIT

# -- packages: the serve bundle unless this python already has the server and the clients ------------------------
if "$PY" -c "import grpc, uvicorn, starlette, httptools, orjson, tritonclient.grpc" 2>/dev/null; then
  echo "serve packages: $PY's own environment (.gpu/serve.tar.xz not used)"
elif [ -f .gpu/serve.tar.xz ]; then
  rm -rf /tmp/serve && mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz
  export PYTHONPATH=/tmp/serve:${PYTHONPATH:-$PWD/src}
  echo "serve packages: .gpu/serve.tar.xz ($(tr '\n' ' ' < /tmp/serve/SERVE_BUNDLE_WHEELS.txt))"
else
  echo "gpu_serve: $PY lacks grpc/uvicorn/starlette/tritonclient and there is no .gpu/serve.tar.xz" \
       "(bash benchmarks/dev/serve_host_bundle.sh)" >&2
  exit 2
fi
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('tilelang') is None)" > "$d/tilelang_import.log" 2>&1; then
  # .gpu/site.tar.xz (41 MB) + .gpu/serve.tar.xz (8 MB) + the tree (21 MB) exceed the 64 MiB a call carries
  echo "gpu_serve: no TileLang: run this in a warm session after a call" \
       "that unpacked .gpu/site.tar.xz into /tmp/site, with PYTHONPATH=/tmp/site:\$PWD/src" >&2
  exit 3
fi
export TILESHIP_HOME=$d/home  # diagnostics bundles, if any, land in the tarball
"$PY" - > "$d/environment.json" 2> "$d/environment.err" <<'EOF'
import importlib.metadata as md, json, os, platform, sys
import torch
names = ["grpcio", "protobuf", "tritonclient", "starlette", "uvicorn", "httptools", "h11", "anyio", "orjson",
         "prometheus-client", "click", "packaging", "typer", "numpy", "ml-dtypes", "tilelang", "apache-tvm-ffi"]
vers = {}
for n in names:
    try:
        vers[n] = md.version(n)
    except md.PackageNotFoundError:
        vers[n] = None
print(json.dumps({"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
                  "cuda": torch.cuda.is_available(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "platform": platform.platform(),
                  "pythonpath": os.environ.get("PYTHONPATH"), "packages": vers}, indent=2))
EOF
cat "$d/environment.json"
cuda=$("$PY" -c "import json; print(int(json.load(open('$d/environment.json'))['cuda']))" 2>/dev/null || echo 0)
git log -1 --format='code %h %s' > "$d/code.txt" 2>/dev/null || true

# -- step NAME MAX_S CMD...: under timeout, cut to the budget left; log in $d/NAME.log ----------------------------
step() {
  local name=$1 max=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then  # ONLY="failover": just those steps
    echo "$name: SKIPPED (not in ONLY=$ONLY)" | tee -a "$d/steps.txt"; return 0
  fi
  local left=$(( BUDGET_S - SECONDS )) t0=$SECONDS rc
  max=$(( max * ${STEP_SCALE:-1} ))  # STEP_SCALE=3 for a slow, shared machine (the CPU dry run)
  local lim=$(( max < left ? max : left ))
  if [ "$lim" -lt 15 ]; then
    echo "$name: SKIPPED (only ${left} s of the ${BUDGET_S} s budget left)" | tee -a "$d/steps.txt"; return 0
  fi
  timeout -k 10 "$lim" "$@" > "$d/$name.log" 2>&1; rc=$?
  echo "$name: rc=$rc $(( SECONDS - t0 )) s (limit $lim)" | tee -a "$d/steps.txt"
  return $rc
}
skip() { echo "$1: SKIPPED ($2)" | tee -a "$d/steps.txt"; }

# -- releases: the CPU catalog ("c") and, in parallel, the fault-injection release (cuda-sm90a on a GPU, else "c") --
dev=$([ "$cuda" = 1 ] && echo cuda || echo cpu)
( timeout 170 "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path
from gpu_fault_recovery import build_release; print(build_release(Path('$d/fault_build'), '$dev'))" \
  > "$d/build_fault.log" 2>&1; echo "build_fault: rc=$? $SECONDS s after start ($dev)" >> "$d/steps.txt" ) &
fault_pid=$!
step build_cpu 120 "$PY" -c "import os, sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path
from serve_load import build_cpu_release; print(build_cpu_release(Path('$d/cpu_build')))"
cpurel=$(tail -1 "$d/build_cpu.log")
wait "$fault_pid"
grep '^build_fault' "$d/steps.txt"
faultrel=$(tail -1 "$d/build_fault.log")
[ -d "$cpurel" ] || { echo "no CPU release: $(tail -5 "$d/build_cpu.log")"; cpurel=; }
[ -d "$faultrel" ] || { echo "no fault release: $(tail -5 "$d/build_fault.log")"; faultrel=; }
echo "cpu release: ${cpurel:-none}; fault release ($dev): ${faultrel:-none}"
export TMPDIR=$d/tmp  # from here on the scripts' temp dirs (server logs) land in the tarball; shared buffers are memfds
mkdir -p "$TMPDIR"

show() { tail -n "$2" "$d/$1.log"; }
# -- issue 15: gRPC over the in-process call, echo floor in the same run (CPU op) -------------------------------
if [ -n "$cpurel" ]; then
  step grpc_add 45 "$PY" benchmarks/serve_grpc_load.py --release "$cpurel" --op add --dims N=4096 \
    --clients 16 --duration 3 --seq 1000 --out "$d/serve_grpc_load_add.json"; show grpc_add 8
  step grpc_rmsnorm 45 "$PY" benchmarks/serve_grpc_load.py --release "$cpurel" --op rmsnorm_cpu --dims M=1,N=1024 \
    --clients 16 --duration 3 --seq 1000 --out "$d/serve_grpc_load_rmsnorm.json"; show grpc_rmsnorm 8
  # -- issue 16: the worker hop and kill -9 on the CPU release (serve_workers.py) ------------------------------
  step workers 110 "$PY" benchmarks/serve_workers.py --release "$cpurel" --rounds 10 --per-round 200 --kills 5 \
    --clients 2 --out "$d/serve_workers.json"
  "$PY" -c "import json; r = json.load(open('$d/serve_workers.json')); l, f = r['latency_us'], r['failover']
print('workers: hop p50', l['hop_p50_us'], 'us, by round', l.get('hop_spread_us'), l.get('hop_verdict'), '(w0', l['workers0']['p50_us'], 'w1', l['workers1']['p50_us'], ');',
      'kill9 -> next answer', f['kill_to_next_answer'], 'new standby', f['kill_to_new_standby'], 'answers', f['answers'],
      'non-200', f['non_200'], 'wrong', f['wrong'])" 2>/dev/null || show workers 5
else
  skip grpc_add "no CPU release"; skip grpc_rmsnorm "no CPU release"; skip workers "no CPU release"
fi
# -- issue 16: hop, kill -9 and the sticky fault through the server on the fault release (the GPU's on the host) --
if [ -n "$faultrel" ]; then
  step failover 100 "$PY" benchmarks/serve_failover.py --release "$faultrel" --work "$d/failover" --rounds 5 \
    --per-round 200 --kills 2 --faults 3 --out "$d/serve_failover.json"
  "$PY" -c "import json; r = json.load(open('$d/serve_failover.json')); print('failover (' + r['device'] + '):', json.dumps(r['summary']))
for f in r['failover']['sticky_fault']: print('  fault:', json.dumps(f))" 2>/dev/null || show failover 5
else
  skip failover "no fault release"
fi
# -- issue 15: HTTP over the in-process call (binary and JSON), CPU op --------------------------------------------
if [ -n "$cpurel" ]; then
  step http_add_binary 35 "$PY" benchmarks/serve_load.py --release "$cpurel" --op add --dims N=4096 \
    --clients 16 --duration 3 --seq 500 --out "$d/serve_load_add_binary.json"; show http_add_binary 6
  step http_add_json 35 "$PY" benchmarks/serve_load.py --release "$cpurel" --op add --dims N=4096 --json \
    --clients 16 --duration 3 --seq 500 --out "$d/serve_load_add_json.json"; show http_add_json 6
  step http_rmsnorm_binary 35 "$PY" benchmarks/serve_load.py --release "$cpurel" --op rmsnorm_cpu --dims M=1,N=1024 \
    --clients 16 --duration 3 --seq 500 --out "$d/serve_load_rmsnorm_binary.json"; show http_rmsnorm_binary 6
fi
# -- issue 15 on the GPU: a CUDA op (fault_copy N=4096, never poisoned here) over gRPC and HTTP --------------------
if [ "$cuda" != 1 ]; then
  skip grpc_cuda "torch.cuda is not available: no CUDA op to serve"
  skip http_cuda "torch.cuda is not available: no CUDA op to serve"
elif [ -z "$faultrel" ]; then
  skip grpc_cuda "no fault release"; skip http_cuda "no fault release"
else
  step grpc_cuda 45 env PYTHONPATH="$PYTHONPATH:$PWD/benchmarks" "$PY" benchmarks/serve_grpc_load.py --release "$faultrel" \
    --op fault_copy --dims N=4096 --clients 16 --duration 3 --seq 1000 --out "$d/serve_grpc_load_cuda_copy.json"
  show grpc_cuda 8
  step http_cuda 35 env PYTHONPATH="$PYTHONPATH:$PWD/benchmarks" "$PY" benchmarks/serve_load.py --release "$faultrel" \
    --op fault_copy --dims N=4096 --allow-unverified --clients 16 --duration 3 --seq 500 \
    --out "$d/serve_load_cuda_copy_binary.json"
  show http_cuda 6
fi
cat "$d/steps.txt"
