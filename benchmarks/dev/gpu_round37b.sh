#!/usr/bin/env bash
# GPU host, repo root: [END=300] bash benchmarks/dev/gpu_round37b.sh OUT_DIR   (round 37, second call; about END s)
# With END >= 540, on an H200 first: W4A16 on the product path (gpu_round24d.sh; issue 12's H200 figures are round 30's).
# Then session 37's serving changes on a GPU (the in-place answers, the gRPC gate): gpu_serve.sh with
# SERVE_ONLY (default "grpc_add failover"); then the gRPC gate's cost, A/B: .ab/base (src/ and benchmarks/ of commit
# 04f838c, before the gate; copied by hand, carried) against this tree, serve_grpc_load.py add N=4096 on the CPU
# release gpu_serve.sh built, base/new alternated twice (OUT_DIR/ab/). On an H100 last: the launch path again
# (gpu_native.sh overhead), to tell round 37's +1.2 us over the floor from the host.
set -u
out=${1:?usage: gpu_round37b.sh OUT_DIR}
mkdir -p "$out/ab" "$out/w4a16"
SECONDS=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "gpu: $gpu"
END=${END:-300}  # the whole call's budget in seconds (the session's device time left decides it)
if [[ "$gpu" == *H200* ]] && [ "$END" -ge 540 ]; then
  VERIFY_TIMEOUT=170 KERNELS_TIMEOUT=130 timeout 300 bash benchmarks/dev/gpu_round24d.sh "$out/w4a16"
  echo "w4a16 done at ${SECONDS} s"
fi
BUDGET_S=$(( END - 110 - SECONDS > 120 ? END - 110 - SECONDS : 120 )) ONLY="${SERVE_ONLY:-grpc_add failover}" \
  bash benchmarks/dev/gpu_serve.sh "$out"
echo "serve done at ${SECONDS} s"
rel=$(find /tmp/gpu_serve/cpu_build -mindepth 1 -maxdepth 1 -type d | head -1)
if [ -n "$rel" ] && [ -d .ab/base/src ]; then
  pp=/tmp/site
  [ -d /tmp/serve ] && pp=/tmp/serve:$pp
  for i in 1 2; do
    for t in base new; do
      [ $(( END - SECONDS )) -lt 40 ] && { echo "ab: no time left at ${SECONDS} s"; break 2; }
      if [ $t = base ]; then root=$PWD/.ab/base; else root=$PWD; fi
      (cd "$root" && PYTHONPATH=$pp:$root/src timeout 60 python3 benchmarks/serve_grpc_load.py --release "$rel" --op add \
        --dims N=4096 --clients 4 --duration 2 --seq 1000 --out "$out/ab/grpc_${t}_$i.json" > "$out/ab/grpc_${t}_$i.log" 2>&1)
      echo "ab $t $i rc $? at ${SECONDS} s"
    done
  done
fi
if [[ "$gpu" != *H200* ]] && [ $(( END - SECONDS )) -gt 90 ]; then
  timeout $(( END - SECONDS )) bash benchmarks/dev/gpu_native.sh "$out" overhead
fi
echo "total ${SECONDS} s"
