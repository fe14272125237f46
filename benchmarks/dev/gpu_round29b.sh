#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round29b.sh OUT_DIR   (issue 12, round 29)
# 1. The three decode paths end to end at context 1k, batch 8 and 1 (gpu_round28a.sh: build the decode project,
#    decode_e2e unverified, pinned routing), into OUT_DIR/e2e.tgz.
# 2. Where the W4A16 M=32 kernel's time goes: Nsight Compute over the catalog's kernels at M=32 on down and gate_up
#    (benchmarks/dev/w4a16_ncu.py; round 13 profiled M=8 only), with the compute sections (pipe use) added,
#    into OUT_DIR/ncu.tgz. Needs .gpu/site.tar.xz carried.
set -u
out=${1:?usage: gpu_round29b.sh OUT_DIR}
mkdir -p "$out/e2e"
BUDGET_S=${BUDGET_S:-330} bash benchmarks/dev/gpu_round28a.sh "$out/e2e"
mv "$out/e2e/all.tgz" "$out/e2e.tgz"; rmdir "$out/e2e"
d=/tmp/round29b; rm -rf "$d"; mkdir -p "$d"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"  # (round 29 ran without this line: ncu's python had no TileLang, rc 1)
t0=$(date +%s)
timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --kernel-name regex:^main \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
  -o "$d/w4a16_m32" python3 benchmarks/dev/w4a16_ncu.py --ops down,gate_up --m 32 > "$d/ncu_run.log" 2>&1
echo "ncu rc=$? ($(( $(date +%s) - t0 )) s)"
ncu --import "$d/w4a16_m32.ncu-rep" --page details > "$d/w4a16_m32_ncu.txt" 2>&1
ncu --import "$d/w4a16_m32.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum > "$d/w4a16_m32_times.csv" 2>&1
xz -9 "$d/w4a16_m32.ncu-rep"
grep -E "main|Duration|Memory Throughput|Achieved Occupancy|No Eligible" "$d/w4a16_m32_ncu.txt" | head -40
tar -C "$d" -czf "$out/ncu.tgz" .
