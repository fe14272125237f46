#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round35a.sh OUT_DIR   (issue 12, round 35)
# 1. gpu_round33c.sh: the warpgroup-MMA W4A16 sweep with the padded shared layout 2 at M = 32 and 8 (down, gate_up),
#    beside the catalog and cuBLAS fp16 (OUT_DIR/wg2.tgz).
# 2. Nsight Compute over the wg kernel (layout 2, WG_CFG, default round 33's best tiling) and the catalog's, down
#    M = 32, 4 calls each after an L2 flush (benchmarks/dev/w4a16_ncu.py --kind catalog,wg): where the wg kernel's
#    time goes, whatever step 1 says (OUT_DIR/ncu.tgz). Needs .gpu/site.tar.xz.
set -u
out=${1:?usage: gpu_round35a.sh OUT_DIR}
mkdir -p "$out"
SECONDS=0
bash benchmarks/dev/gpu_round33c.sh "$out"
d=/tmp/round35a; rm -rf "$d"; mkdir -p "$d"
finish() { tar -C "$d" -czf "$out/ncu.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
cfg=${WG_CFG:-'{"wk": 2, "ks": 2, "unroll": 1, "x_depth": 2, "layout": 2}'}
echo "$cfg" > "$d/wg_cfg.json"
timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:^main \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section SchedulerStats --section InstructionStats --section SourceCounters \
  -o "$d/wg_m32" python3 benchmarks/dev/w4a16_ncu.py --ops down --m 32 --kind catalog,wg --cfg "$cfg" \
  > "$d/ncu_run.log" 2>&1
echo "ncu rc=$? ($SECONDS s)"
ncu --import "$d/wg_m32.ncu-rep" --page details > "$d/wg_m32_ncu.txt" 2>&1
ncu --import "$d/wg_m32.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum > "$d/wg_m32_times.csv" 2>&1
xz -9 "$d/wg_m32.ncu-rep"
grep -E "^  main|Duration|DRAM Throughput|Achieved Occupancy|No Eligible|Registers Per|Waves Per SM|Bank" \
  "$d/wg_m32_ncu.txt" | head -60
echo "total $SECONDS s"
