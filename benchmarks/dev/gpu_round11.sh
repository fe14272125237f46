#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round11.sh OUT_DIR
# The decode project on the product path after the LOP3 register-decode W4A16 change: build, verify,
# report, decode_kernels (benchmarks/gpu_decode.sh), then decode_e2e at context 1k for batches 1, 8, 32,
# then a small W4A16 sweep (the catalog's pick vs the scale-on-partials decode) at M 8 and 32.
# The decode folder is packed into decode.tgz (the device returns at most 8 files).
set -u
out=${1:?usage: gpu_round11.sh OUT_DIR}
t0=$(date +%s)
mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz && tar -C /tmp/site -xf .gpu/ascend.tar
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
echo "unpacked $(( $(date +%s) - t0 )) s; tree $(git rev-parse --short HEAD 2>/dev/null)"
VERIFY_ARGS="--grid 2" timeout 360 bash benchmarks/gpu_decode.sh "$out/decode"
rel=$(cat "$out/decode/release_path.txt")
timeout 170 python3 benchmarks/decode_e2e.py --release "$rel" --out "$out/decode/decode_e2e.json" --contexts 1024 \
  --batches 1,8,32 --rms-eps 1e-6 --require-evidence --deadline-s 150 > "$out/decode/decode_e2e.log" 2>&1
echo "decode_e2e rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ratio|FAIL|wrote" "$out/decode/decode_e2e.log" | tail -8
(cd benchmarks/dev && timeout 120 python3 w4a16_sweep.py "$out/w4a16_sweep_post.json" --ms 8,32 --kinds catalog,rslp \
  --jobs 15 > "$out/w4a16_sweep_post.log" 2>&1); echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"
tar -C "$out" -czf "$out/decode.tgz" decode && rm -rf "$out/decode"
