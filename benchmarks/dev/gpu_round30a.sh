#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round30a.sh OUT_DIR   (issue 12, round 30)
# 1. W4A16 at M=16 and 32: the rule kernel with 128 or 256 weight rows a block, one warpgroup per 64 rows
#    (w4a16_sweep.py kind "rsr", w4a16_gemm_rs(rows_per_warpgroup=True)), beside the rule and cuBLAS fp16, every
#    variant checked against float32, into OUT_DIR/sweep.tgz (gpu_round24b.sh).
# 2. W4A16 on the product path at this tree (gpu_round24d.sh: build benchmarks/decode/w4a16.toml, tileship verify
#    --grid 2, decode_kernels.py --ops w4a16_linear), into OUT_DIR/w4a16.tgz. Needs .gpu/site.tar.xz carried.
set -u
out=${1:?usage: gpu_round30a.sh OUT_DIR}
mkdir -p "$out/s" "$out/w"
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-170} bash benchmarks/dev/gpu_round24b.sh "$out/s" "${MS:-32,16}" rsr,rule \
  "${OPS:-down,gate_up,o,qkv}"
mv "$out/s/all.tgz" "$out/sweep.tgz"; rmdir "$out/s"
python3 - /tmp/round24b/w4a16_sweep_mv.json <<'PY' 2>&1
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    c = [x for x in r["candidates"] if "us" in x and x["relerr"] < 2e-2]
    rule = next((x for x in c if x["kind"] == "rule"), None)
    rsr = sorted((x for x in c if x["kind"] == "rsr"), key=lambda x: x["us"])
    bad = [x for x in r["candidates"] if "us" in x and x["relerr"] >= 2e-2]
    best = rsr[0] if rsr else None
    print(f"{r['op']:8s} M={r['M']:3d} cuBLAS {r['cublas_fp16_us']:6.1f} rule {rule['us'] if rule else 0:6.1f} "
          f"rsr {best['us'] if best else 0:6.1f} {best['p10_p90'] if best else ''} "
          f"{ {k: best['cfg'][k] for k in ('block_N', 'split_k', 'num_stages')} if best else ''} wrong {len(bad)}")
PY
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-170} KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-120} bash benchmarks/dev/gpu_round24d.sh "$out/w"
mv "$out/w/all.tgz" "$out/w4a16.tgz"; rmdir "$out/w"
echo "total $SECONDS s"
