#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round2.sh OUT_DIR   (prepared on the CPU machine, not yet run)
# What the 2026-12-01 session left unmeasured, in one call (about 8 minutes):
#   1) the decode project: build, verify --grid 2, decode_e2e with the KV-cache write outside the
#      compiled halves (f3286c6): do the B=8/B=32 W4A16 ratios rise once the benchmark's own
#      whole-cache copies are gone?
#   2) runtime_overhead --load on the launch project: load time per specialization through
#      runtime.artifact (issue 17: at most 5 ms on the H200)
# Everything also lands in OUT_DIR/all.tgz (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_round2.sh OUT_DIR}
mkdir -p "$out"
finish() { tar -C "$out" --exclude all.tgz -czf /tmp/round.tgz . && mv /tmp/round.tgz "$out/all.tgz"; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
timeout 150 python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 \
  > "$out/build.log" 2>&1; echo "build rc=$? ($(( $(date +%s) - t0 )) s)"
drel=$(ls -td /tmp/decode-rel/*/ | head -1)
timeout 150 python3 -m tileship.cli verify "$drel" --grid 2 --json-out "$out/verification.json" > "$out/verify.log" 2>&1
echo "verify rc=$?"; grep -cE "passed" "$out/verify.log"
timeout 60 python3 -m tileship.cli build --project benchmarks/launch/tileship.toml --out /tmp/launch-rel -j 16 > "$out/build_launch.log" 2>&1
lrel=$(ls -td /tmp/launch-rel/*/ | head -1)
timeout 90 python3 benchmarks/runtime_overhead.py --release "$lrel" --device cuda --rounds 5 --load \
  --out "$out/runtime_overhead_load.json" > "$out/runtime_overhead_load.txt" 2>&1
echo "runtime_overhead --load rc=$?"; grep -i -A6 "load" "$out/runtime_overhead_load.txt" | tail -12
left=$(( ${BUDGET_S:-560} - SECONDS ))
[ "$left" -gt 60 ] && timeout "$left" python3 benchmarks/decode_e2e.py --release "$drel" --deadline-s $(( left - 40 )) \
  --rms-eps 1e-6 --require-evidence --out "$out/decode_e2e.json" > "$out/decode_e2e.log" 2>&1
echo "decode_e2e rc=$?"; tail -12 "$out/decode_e2e.log"
