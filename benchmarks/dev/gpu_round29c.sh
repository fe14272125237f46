#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round29c.sh OUT_DIR   (issue 12, round 29)
# Where the W4A16 decode-batch kernel's time goes at M=32 against M=8, in one call: Nsight Compute over the catalog's
# kernels (benchmarks/dev/w4a16_ncu.py: w4a16_linear's kernel, 4 calls each after an L2 flush) on down and gate_up,
# with the compute and instruction sections added to round 13's. gpu_round29b.sh's ncu step is this one's first half
# (it failed there: no TileLang on ncu's python). Needs .gpu/site.tar.xz carried. OUT_DIR/ncu.tgz.
set -u
out=${1:?usage: gpu_round29c.sh OUT_DIR}
d=/tmp/round29c; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/ncu.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
for m in 32 8; do
  t0=$(date +%s)
  timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --kernel-name regex:^main \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    -o "$d/w4a16_m$m" python3 benchmarks/dev/w4a16_ncu.py --ops down,gate_up --m "$m" > "$d/ncu_run_m$m.log" 2>&1
  echo "ncu M=$m rc=$? ($(( $(date +%s) - t0 )) s)"
  ncu --import "$d/w4a16_m$m.ncu-rep" --page details > "$d/w4a16_m${m}_ncu.txt" 2>&1
  ncu --import "$d/w4a16_m$m.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum > "$d/w4a16_m${m}_times.csv" 2>&1
  xz -9 "$d/w4a16_m$m.ncu-rep"
  grep -E "^  main|Duration|DRAM Throughput|Achieved Occupancy|No Eligible|Registers Per|Waves Per SM" \
    "$d/w4a16_m${m}_ncu.txt" | head -60
done
