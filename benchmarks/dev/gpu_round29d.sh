#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round29d.sh OUT_DIR   (issue 12, round 29)
# The W4A16 split-K sum with every split's load in flight (w4a16_tc reduce="vector", in the catalog's rule from round
# 29 on): 1. side by side with the looped sum (w4a16_sweep.py kinds rule, rulev) at M=16 and 32 on down, o and qkv,
# the shapes whose rule splits K; 2. the W4A16 operator on the product path (gpu_round24d.sh: build, tileship verify,
# decode_kernels.py). Needs .gpu/site.tar.xz carried. OUT_DIR/sweep.tgz, OUT_DIR/w4a16.tgz.
set -u
out=${1:?usage: gpu_round29d.sh OUT_DIR}
mkdir -p "$out/s" "$out/w"
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-150} bash benchmarks/dev/gpu_round24b.sh "$out/s" 16,32 rule,rulev down,o,qkv
mv "$out/s/all.tgz" "$out/sweep.tgz"
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-180} KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-150} bash benchmarks/dev/gpu_round24d.sh "$out/w"
mv "$out/w/all.tgz" "$out/w4a16.tgz"; rmdir "$out/s" "$out/w"
python3 - /tmp/round24d/decode_kernels.json <<'PY' 2>&1
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["M"] in (16, 32):
        s = r["speedup_vs"]
        print(f"{r['spec'][:50]:50s} {r['path']:7s} vs cuBLAS fp16 {s['cublas_fp16']['ratio']:.2f}"
              f" ({s['cublas_fp16']['resolved']}) err {r['rel_l2_err']:.1e}")
PY
