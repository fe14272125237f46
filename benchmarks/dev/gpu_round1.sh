#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round1.sh OUT_DIR
# First GPU call of a session: does the release loader (runtime.artifact, no TileLang Python) load and
# serve CUDA kernels? gpu_decode.sh (build, verify --grid 2, report, decode_kernels with the paged op),
# the fast-launch check, the launch project's runtime_overhead, then decode_e2e under a deadline.
# Everything also lands in OUT_DIR/all.tgz (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_round1.sh OUT_DIR}
mkdir -p "$out"
finish() { tar -C "$out" --exclude all.tgz -czf /tmp/round.tgz . && mv /tmp/round.tgz "$out/all.tgz"; }
trap finish EXIT
VERIFY_ARGS="${VERIFY_ARGS:---grid 2}" timeout 330 bash benchmarks/gpu_decode.sh "$out/dec" 2>&1 | tee "$out/gpu_decode.out"
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
drel=$(cat "$out/dec/release_path.txt" 2>/dev/null || ls -td /tmp/decode-rel/*/ | head -1)
timeout 60 python3 benchmarks/fast_launch_check.py "$drel" > "$out/fast_launch_check.log" 2>&1
echo "fast launch check rc=$?"; tail -3 "$out/fast_launch_check.log"
t0=$(date +%s)
timeout 60 python3 -m tileship.cli build --project benchmarks/launch/tileship.toml --out /tmp/launch-rel -j 16 > "$out/build_launch.log" 2>&1
echo "build launch rc=$? ($(( $(date +%s) - t0 )) s)"
lrel=$(ls -td /tmp/launch-rel/*/ | head -1)
timeout 90 python3 benchmarks/runtime_overhead.py --release "$lrel" --device cuda --rounds 9 \
  --out "$out/runtime_overhead.json" > "$out/runtime_overhead.txt" 2>&1
echo "runtime_overhead rc=$?"; tail -25 "$out/runtime_overhead.txt"
left=$(( ${BUDGET_S:-560} - SECONDS ))
echo "decode_e2e deadline ${left}s"
[ "$left" -gt 60 ] && timeout "$left" python3 benchmarks/decode_e2e.py --release "$drel" --deadline-s $(( left - 40 )) \
  --rms-eps 1e-6 --out "$out/decode_e2e.json" > "$out/decode_e2e.log" 2>&1
echo "decode_e2e rc=$?"; tail -15 "$out/decode_e2e.log"
