#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round12b.sh OUT_DIR
# Round 12, the swizzled packed tile of w4a16_gemm_rs: (1) the kernel sweep, the catalog's rule unswizzled
# ("rule") beside the swizzled tilings ("rsw") at M = 4, 8, 16, 32, fp16; (2) the decode project on the
# product path with the catalog now swizzled: build, verify, decode_kernels for w4a16_linear only.
# Everything is packed into OUT_DIR/round12b.tgz after each step (the device returns at most 8 files,
# and a call cut short by the session's device budget still returns what was packed).
set -u
out=${1:?usage: gpu_round12b.sh OUT_DIR}
d=/tmp/round12b; mkdir -p "$d" "$out"
pack() { tar -C "$d" -czf "$out/round12b.tgz" .; }
t0=$(date +%s)
mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz && tar -C /tmp/site -xf .gpu/ascend.tar
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$d/nvidia-smi.csv" 2>&1
(cd benchmarks/dev && timeout 170 python3 w4a16_sweep.py "$d/w4a16_sweep_swizzle.json" --ms 4,8,16,32 --kinds rule,rsw \
  --jobs 15 > "$d/w4a16_sweep_swizzle.log" 2>&1)
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; pack
DK_ARGS="--ops w4a16_linear" VERIFY_ARGS="--grid 2" timeout $(( 540 - ($(date +%s) - t0) )) bash benchmarks/gpu_decode.sh "$d/decode"
echo "decode rc=$? ($(( $(date +%s) - t0 )) s)"; pack
