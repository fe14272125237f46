#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round13a.sh OUT_DIR
# Where the W4A16 decode-batch kernel's time goes: Nsight Compute over the catalog's kernels at M=8
# (benchmarks/dev/w4a16_ncu.py), then the sweep of the swizzled tile and of scales read where they are
# used (kinds rsw, rsg) at M=8 and 32. Round 12 lost its swizzle sweep to a 170 s limit (the compile alone
# took 163 s on a fresh machine); this one gets what is left of 560 s. Packed into OUT_DIR/round13a.tgz.
set -u
out=${1:?usage: gpu_round13a.sh OUT_DIR}
d=/tmp/round13a; mkdir -p "$d" "$out"
pack() { tar -C "$d" -czf "$out/round13a.tgz" .; }
t0=$(date +%s)
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
timeout 150 ncu --clock-control none --kernel-name regex:^main \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section SchedulerStats -o "$d/w4a16" \
  python3 benchmarks/dev/w4a16_ncu.py --ops down,gate_up,o --m 8 > "$d/ncu_run.log" 2>&1
echo "ncu rc=$? ($(( $(date +%s) - t0 )) s)"
ncu --import "$d/w4a16.ncu-rep" --page details > "$d/w4a16_ncu.txt" 2>&1
ncu --import "$d/w4a16.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum > "$d/w4a16_ncu_times.csv" 2>&1
grep -E "main|Duration|Memory Throughput|Achieved Occupancy" "$d/w4a16_ncu.txt" | head -40; pack
(cd benchmarks/dev && timeout $(( 560 - ($(date +%s) - t0) )) python3 w4a16_sweep.py "$d/w4a16_sweep_swizzle.json" \
  --ms 8,32 --kinds rule,rsw,rsg --jobs 15 > "$d/w4a16_sweep_swizzle.log" 2>&1)
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; pack
