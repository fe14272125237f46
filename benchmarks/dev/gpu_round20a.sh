#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round20a.sh OUT_DIR   (issues 13 and 16, round 20, call 1)
# 1. Option B at this tree (issue 13): build the tuned project on the host, tileship tune (--clock latency),
#    served_vs_best.py --routing pinned then evidence, both in this one call.
# 2. Large tensors over HTTP after the benchmark client's fix (issue 16): build benchmarks/serve_shm/tileship.toml
#    (the catalog GEMM) on the host, then serve_shm.py, 4096^3 fp16: binary HTTP, system shm, CUDA shm vs in-process.
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz (benchmarks/dev/serve_host_bundle.sh) carried. All in OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round20a.sh OUT_DIR}
d=/tmp/round20a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz && export PYTHONPATH=/tmp/serve:$PYTHONPATH
python3 -c "import starlette, uvicorn, tritonclient, cuda.bindings; print('serve packages ok')"
t0=$(date +%s)
timeout "${BUILD_TIMEOUT:-150}" python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel \
  -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout "${TUNE_TIMEOUT:-240}" python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock latency > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/tune.log"
cp "$rel/evidence/verification.json" "$d/verification.json" 2>/dev/null
for routing in pinned evidence; do
  t1=$(date +%s)
  timeout "${SVB_TIMEOUT:-150}" python3 benchmarks/served_vs_best.py "$rel" --routing $routing \
    --out "$d/served_vs_best_$routing.json" --budget-ms 15 > "$d/served_vs_best_$routing.txt" 2>&1
  echo "served_vs_best $routing rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$d/served_vs_best_$routing.txt"
done
xz -9 "$d/verification.json" "$d/tune.log" "$d"/served_vs_best_*.json 2>/dev/null
t1=$(date +%s)
timeout "${SHM_BUILD_TIMEOUT:-120}" python3 -m tileship.cli build --project benchmarks/serve_shm/tileship.toml \
  --out /tmp/serve-shm-rel -j 16 > "$d/shm_build.log" 2>&1
echo "shm build rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$d/shm_build.log"
srel=$(ls -td /tmp/serve-shm-rel/*/ | head -1)
left=$(( 580 - SECONDS ))
if [ "$left" -gt 40 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/serve_shm.py --release "$srel" --op gemm --dims M=4096,N=4096,K=4096 \
    --dtype float16 --allow-unverified --seq 40 --out "$d/serve_shm_gemm4096.json" > "$d/serve_shm.log" 2>&1
  echo "serve_shm rc=$? ($(( $(date +%s) - t1 )) s)"; tail -9 "$d/serve_shm.log" | cut -c1-260
else
  echo "no time for serve_shm ($left s left)"
fi
echo "total ${SECONDS} s"
