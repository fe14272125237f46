#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round35b.sh OUT_DIR   (issues 14 and 12, round 35)
# 1. gpu_native.sh overhead: the launch project built here, the compiled table's answers checked
#    (fast_launch_check.py), runtime_overhead.py over 15 rounds: the first GPU run of the dispatcher after the
#    reference-answer checks of rounds 33-35 (OUT_DIR/all_overhead.tgz).
# 2. The warpgroup-MMA W4A16 sweep with the padded layout 2 on the other projections (lm_head, qkv, o) at M = 32
#    and 16, beside the catalog and cuBLAS fp16 (OUT_DIR/wg_other.tgz). Needs .gpu/site.tar.xz.
set -u
out=${1:?usage: gpu_round35b.sh OUT_DIR}
mkdir -p "$out"
SECONDS=0
bash benchmarks/dev/gpu_native.sh "$out" overhead
d=/tmp/round35b; rm -rf "$d"; mkdir -p "$d"
finish() { tar -C "$d" -czf "$out/wg_other.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
left=$(( ${BUDGET_S:-540} - SECONDS - 15 ))
if [ "$left" -lt 60 ]; then echo "no time left for the sweep ($SECONDS s)"; exit 0; fi
(cd benchmarks/dev && WG_LAYOUT=2,0,0 timeout "$left" python3 w4a16_sweep.py "$d/sweep.json" --ms 32,16 \
  --kinds wg,catalog --ops lm_head,qkv,o --jobs 16 > "$d/sweep.log" 2>&1)
echo "sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/sweep.log"
