#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round32a.sh OUT_DIR   (issues 12 and 16, one call of at most ~520 s)
# 1. Issue 12: the W4A16 MMA-GEMV at M=8 with the L2 prefetch-size hint on its weight loads (gpu_round32b.sh;
#    SKIP_SWEEP=1 skips it).
# 2. Issue 16, the serving changes of sessions 31-32 on the host (they ran on the CPU machine only): gpu_serve.sh's
#    build_cpu, workers and failover steps: the worker hop (serve_workers.py, one block a round), kill -9 of the
#    serving worker under load, and the sticky CUDA fault through the server with the fault-injection kernel
#    (serve_failover.py, a CUDA release built here).
# 3. The hop again with the servers taking turns every 20 requests within a round (serve_workers.py --block 20).
# 4. With OVERHEAD=1, last: the launch path (gpu_native.sh's overhead stage: the launch project built here,
#    fast_launch_check.py, runtime_overhead.py --rounds 15).
# Carries .gpu/site.tar.xz (the slim one, benchmarks/dev/gpu_bundle_slim.sh) and .gpu/serve.tar.xz.
set -u
out=${1:?usage: gpu_round32a.sh OUT_DIR}
mkdir -p "$out"
git log -1 --format='%H %s' > "$out/commit.txt" 2>/dev/null || true
bash benchmarks/tree_digest.sh > "$out/tree_digest.txt" 2>&1
# 1.
if [ -z "${SKIP_SWEEP:-}" ]; then
  bash benchmarks/dev/gpu_round32b.sh "$out/mvp"; echo "mvp sweep: rc=$? ${SECONDS} s"
fi
# 2.
t0=$SECONDS
ONLY="build_cpu workers failover" BUDGET_S=${SERVE_BUDGET_S:-270} bash benchmarks/dev/gpu_serve.sh "$out/serve"
echo "serve: rc=$? $(( SECONDS - t0 )) s"
# 3. (on the CPU machine --block 20 measured a larger hop than one block a round; which does the host show?)
t2=$SECONDS
rel=$(tail -1 /tmp/gpu_serve/build_cpu.log 2>/dev/null)
if [ -n "${SKIP_BLOCK20:-}" ]; then
  echo "block20: SKIPPED (SKIP_BLOCK20)"
elif [ -n "$rel" ] && [ -d "$rel" ]; then
  . benchmarks/gpu_env.sh "$out/block20_nvidia-smi.csv"
  export PYTHONPATH=/tmp/serve:$PYTHONPATH
  timeout 100 python3 benchmarks/serve_workers.py --release "$rel" --rounds 10 --per-round 200 --kills 0 --block 20 \
    --out "$out/serve_workers_block20.json" > "$out/serve_workers_block20.log" 2>&1
  echo "block20: rc=$? $(( SECONDS - t2 )) s"
  python3 -c "import json; l = json.load(open('$out/serve_workers_block20.json'))['latency_us']
print({k: v for k, v in l.items() if 'hop' in k})" 2>/dev/null
else
  echo "block20: SKIPPED (no CPU release: /tmp/gpu_serve/build_cpu.log)"
fi
# 4. The launch path, when asked for (OVERHEAD=1; about 120 s)
if [ -n "${OVERHEAD:-}" ]; then
  t1=$SECONDS
  bash benchmarks/dev/gpu_native.sh "$out/overhead" overhead
  echo "overhead: rc=$? $(( SECONDS - t1 )) s"
fi

