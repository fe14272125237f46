#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round33c.sh OUT_DIR   (issue 12, round 33, second call)
# The warpgroup-MMA W4A16 sweep (kind wg) with the padded shared layout 2 (w4a16_wgmma.offsets), M = 32 and 8, down and
# gate_up, beside the catalog and cuBLAS fp16. Needs .gpu/site.tar.xz. OUT_DIR/wg2.tgz.
set -u
d=/tmp/round33c; rm -rf "$d"; out=${1:?usage: gpu_round33c.sh OUT_DIR}; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/wg2.tgz" .; }
trap finish EXIT
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
export WG_LAYOUT=2,0,0
(cd benchmarks/dev && timeout 170 python3 w4a16_sweep.py "$d/sweep.json" --ms 32,8 --kinds wg,catalog --ops down,gate_up --jobs 16 > "$d/sweep.log" 2>&1)
echo "sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/sweep.log"
