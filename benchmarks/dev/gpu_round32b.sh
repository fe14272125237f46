#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round32b.sh OUT_DIR   (issue 12, round 32)
# The W4A16 MMA-GEMV at M = 8 (and MS=...) with its weight loads asking L2 for the aligned 128 or 256 bytes
# around them (w4a16_sweep.py kind "mvp": w4a16_gemm_mv(l2_prefetch=...), the catalog's tiling and its neighbours,
# each also with 0 = the catalog's kernel) beside the catalog's pick and cuBLAS fp16; every variant checked against
# float32. Needs .gpu/site.tar.xz carried. OUT_DIR/sweep.tgz.
set -u
out=${1:?usage: gpu_round32b.sh OUT_DIR}
d=/tmp/round32b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/sweep.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
(cd benchmarks/dev && timeout "${SWEEP_TIMEOUT:-200}" python3 w4a16_sweep.py "$d/fp16.json" --ms "${MS:-8}" \
  --kinds mvp,catalog --ops "${OPS:-down,gate_up,qkv,o,lm_head}" --jobs 16 > "$d/fp16.log" 2>&1)
echo "fp16 sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/fp16.log"
python3 - "$d/fp16.json" <<'PY' 2>&1 | tee "$d/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    c = [x for x in r["candidates"] if x["dtype"] == "float16" and "us" in x]
    ok = [x for x in c if x["relerr"] < 2e-2]
    cat = next((x for x in ok if x["kind"] == "catalog"), None)
    line = f"{r['op']:8s} M={r['M']} cuBLAS {r['cublas_fp16_us']:6.2f} catalog {cat['us'] if cat else 0:6.2f} " \
           f"{[round(v, 2) for v in cat['p10_p90']] if cat else ''} wrong {len(c) - len(ok)}"
    print(line)
    for l2 in (0, 128, 256):
        best = min((x for x in ok if x["kind"] == "mvp" and x["cfg"].get("l2_prefetch") == l2),
                   key=lambda x: x["us"], default=None)
        if best:
            print(f"    l2 {l2:3d}: {best['us']:6.2f} {[round(v, 2) for v in best['p10_p90']]} "
                  f"wk {best['cfg']['wk']} unroll {best['cfg']['unroll']} {best['tbps']:.2f} TB/s "
                  f"x{r['cublas_fp16_us'] / best['us']:.2f}")
PY
echo "total $SECONDS s"
