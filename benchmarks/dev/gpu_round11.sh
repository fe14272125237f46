#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round11.sh OUT_DIR
# The decode project on the product path: build, verify, report, decode_kernels (benchmarks/gpu_decode.sh),
# then decode_e2e at context 1k for batches 1, 8, 32. (Round 11 also ran a W4A16 sweep here; the kernel
# sweeps now go in a call of their own, e.g. the pair decode:
#   cd benchmarks/dev && python3 w4a16_sweep.py OUT.json --ms 4,8,16,32 --kinds rule,rsp --bf16-all --jobs 15)
# The decode folder is packed into decode.tgz (the device returns at most 8 files).
set -u
out=${1:?usage: gpu_round11.sh OUT_DIR}
t0=$(date +%s)
mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz && tar -C /tmp/site -xf .gpu/ascend.tar
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
echo "unpacked $(( $(date +%s) - t0 )) s; tree $(git rev-parse --short HEAD 2>/dev/null)"
# build ~150 s + verify ~160 s + report + decode_kernels ~40 s on the H200 host (round 11): 360 s was too short
VERIFY_ARGS="--grid 2" timeout 450 bash benchmarks/gpu_decode.sh "$out/decode"
rel=$(cat "$out/decode/release_path.txt" 2>/dev/null || ls -d /tmp/decode-rel/*/ | head -1)
timeout 100 python3 benchmarks/decode_e2e.py --release "$rel" --out "$out/decode/decode_e2e.json" --contexts 1024 \
  --batches 1,8,32 --rms-eps 1e-6 --require-evidence --deadline-s 80 > "$out/decode/decode_e2e.log" 2>&1
echo "decode_e2e rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ratio|FAIL|wrote" "$out/decode/decode_e2e.log" | tail -8
tar -C "$out" -czf "$out/decode.tgz" decode && rm -rf "$out/decode"
