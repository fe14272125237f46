#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round14.sh OUT_DIR
# The decode project on the product path at this tree (round 14): build, verify, report, decode_kernels
# (benchmarks/gpu_decode.sh; TileLang from .gpu/site.tar.xz through benchmarks/gpu_env.sh), then decode_e2e
# at batch 1, contexts 1k and 8k. The decode folder is packed into decode.tgz (the device returns at most 8 files).
set -u
out=${1:?usage: gpu_round14.sh OUT_DIR}
t0=$(date +%s)
echo "tree $(git rev-parse --short HEAD 2>/dev/null) (the device's .git may lag)"
VERIFY_ARGS="--grid 2" timeout 440 bash benchmarks/gpu_decode.sh "$out/decode"
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
rel=$(cat "$out/decode/release_path.txt" 2>/dev/null || ls -d /tmp/decode-rel/*/ | head -1)
timeout 110 python3 benchmarks/decode_e2e.py --release "$rel" --out "$out/decode/decode_e2e.json" --contexts 1024,8192 \
  --batches 1 --rms-eps 1e-6 --require-evidence --deadline-s 95 > "$out/decode/decode_e2e.log" 2>&1
echo "decode_e2e rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ratio|FAIL|wrote" "$out/decode/decode_e2e.log" | tail -8
tar -C "$out" -czf "$out/decode.tgz" decode && rm -rf "$out/decode"
