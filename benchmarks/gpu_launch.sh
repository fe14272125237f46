#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/gpu_launch.sh OUT_DIR   (issue 14: the launch path on the H200)
#   1) build benchmarks/launch/tileship.toml (CUDA add + RMSNorm) and the decode project on the host
#   2) benchmarks/fast_launch_check.py on both, with TILESHIP_FAST_LAUNCH=cuda (correct results through the
#      fast launcher for every CUDA kernel: add, RMSNorm, W4A16 GEMV/GEMM, GQA split-KV decode)
#   3) benchmarks/runtime_overhead.py --device cuda on the launch release, fast launcher on and off
#   4) benchmarks/build_speed.py --project benchmarks/tuned/cpu/tileship.toml (a build with candidates, 16 cores)
# Everything also lands in OUT_DIR/all.tgz (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_launch.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
python3 -m tileship.cli build --project benchmarks/launch/tileship.toml --out /tmp/launch-rel -j 16 > "$out/build_launch.log" 2>&1
echo "build launch rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/build_launch.log"
t0=$(date +%s)
python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 > "$out/build_decode.log" 2>&1
echo "build decode rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/build_decode.log"
lrel=$(ls -td /tmp/launch-rel/*/ | head -1); drel=$(ls -td /tmp/decode-rel/*/ | head -1)
for r in "$lrel" "$drel"; do
  TILESHIP_FAST_LAUNCH=cuda python3 benchmarks/fast_launch_check.py "$r" >> "$out/fast_launch_check.log" 2>&1
  echo "fast launch check $(basename "$r") rc=$?"; tail -1 "$out/fast_launch_check.log"
done
TILESHIP_FAST_LAUNCH=cuda python3 benchmarks/runtime_overhead.py --release "$lrel" --device cuda \
  --out "$out/runtime_overhead_fast.json" > "$out/runtime_overhead_fast.txt" 2>&1
echo "runtime_overhead (fast launcher) rc=$?"; grep -E "^(add|rms)|kernel |torch|floor" "$out/runtime_overhead_fast.txt" | head -20
TILESHIP_FAST_LAUNCH=off python3 benchmarks/runtime_overhead.py --release "$lrel" --device cuda --rounds 9 \
  --out "$out/runtime_overhead_adapter.json" > "$out/runtime_overhead_adapter.txt" 2>&1
echo "runtime_overhead (adapter) rc=$?"
python3 benchmarks/build_speed.py --project benchmarks/tuned/cpu/tileship.toml --limit 16 --jobs 16 \
  --out "$out/build_speed_candidates.json" > "$out/build_speed_candidates.txt" 2>&1
echo "build_speed rc=$?"; sed -n 1,2p "$out/build_speed_candidates.txt"
tar -C "$out" -czf /tmp/gpu_launch.tgz . && mv /tmp/gpu_launch.tgz "$out/all.tgz"
