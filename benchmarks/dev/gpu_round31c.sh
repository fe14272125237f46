#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round31c.sh OUT_DIR   (issue 12, round 31, one call)
# 1. W4A16 on the product path with the catalog's M < 4 GEMV at K = 14336 streaming through a cp.async ring of 4
#    K steps a warp (w4a16.ring_depth): gpu_round24d.sh (build benchmarks/decode/w4a16.toml, tileship verify
#    --grid 2, decode_kernels.py --ops w4a16_linear) into OUT_DIR/w4a16.tgz.
# 2. gpu_round31a.sh on down only (ring depths and tilings, kind gemv3a, beside gemv3 and the catalog), fp16 M=1,2.
# 3. gpu_round31b.sh on down only (the MMA-GEMV with a cp.async ring, kind mva) at M=8, 32.
# Needs .gpu/site.tar.xz carried.
set -u
out=${1:?usage: gpu_round31c.sh OUT_DIR}
mkdir -p "$out/w"
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-140} KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-100} bash benchmarks/dev/gpu_round24d.sh "$out/w"
mv "$out/w/all.tgz" "$out/w4a16.tgz"; rmdir "$out/w"
echo "product path done ($SECONDS s)"
python3 - /tmp/round24d/decode_kernels.json <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
print("release", d.get("release"))
for r in sorted(d["rows"], key=lambda r: (r["dtype"], r["M"], r["N"])):
    t, s = r["times"], r["speedup_vs"]
    print(f"{r['dtype'][:4]} M={r['M']:2d} N={r['N']:6d} K={r['K']:5d} {r['path']:6s} {t['tileship']['us']:7.2f} us "
          f"cuBLAS {t['cublas_fp16']['us']:7.2f} x{s['cublas_fp16']['ratio']:.2f} ({s['cublas_fp16']['resolved']}) "
          f"int4 x{s.get('torch_int4', {}).get('ratio', 0):.2f} err {r['rel_l2_err']:.1e}")
PY
[ "${SKIP_SWEEPS:-0}" = 1 ] && { echo "total $SECONDS s"; exit 0; }
OPS=down SWEEP_TIMEOUT=${A_TIMEOUT:-80} BF16_TIMEOUT=1 bash benchmarks/dev/gpu_round31a.sh "$out/a" 2>&1 | grep -v "^bf16\|^$"
echo "gemv3a done ($SECONDS s)"
[ "${SKIP_MVA:-0}" = 1 ] || OPS=down SWEEP_TIMEOUT=${B_TIMEOUT:-60} bash benchmarks/dev/gpu_round31b.sh "$out/b"
echo "total $SECONDS s"
