#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round31b.sh OUT_DIR   (issue 12, round 31)
# W4A16 MMA-GEMV at M = 8..32 with its weights streamed through a cp.async ring of D groups a warp
# (w4a16_sweep.py kind "mva", catalog/w4a16_mma_async.py) beside the catalog's pick and cuBLAS fp16, every
# variant checked against float32. Needs .gpu/site.tar.xz carried. OUT_DIR/sweep.tgz.
set -u
out=${1:?usage: gpu_round31b.sh OUT_DIR}
d=/tmp/round31b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/sweep.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
(cd benchmarks/dev && timeout "${SWEEP_TIMEOUT:-200}" python3 w4a16_sweep.py "$d/mva.json" --ms "${MS:-8,32}" \
  --kinds mva,catalog --ops "${OPS:-down,gate_up}" --jobs 16 > "$d/mva.log" 2>&1)
echo "mva sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/mva.log"
python3 - "$d/mva.json" <<'PY' 2>&1
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    c = [x for x in r["candidates"] if "us" in x]
    ok = [x for x in c if x["relerr"] < 2e-2]
    cat = next((x for x in ok if x["kind"] == "catalog"), None)
    a = min((x for x in ok if x["kind"] == "mva"), key=lambda x: x["us"], default=None)
    print(f"{r['op']:8s} M={r['M']:2d} cuBLAS {r['cublas_fp16_us']:6.1f} catalog {cat['us'] if cat else 0:6.2f} "
          f"{[round(v, 2) for v in cat['p10_p90']] if cat else ''} mva {a['us'] if a else 0:6.2f} "
          f"{[round(v, 2) for v in a['p10_p90']] if a else ''} {a['cfg'] if a else ''} "
          f"x{r['cublas_fp16_us'] / a['us'] if a else 0:.2f} wrong {len(c) - len(ok)} failed "
          f"{sum(1 for x in r['candidates'] if 'error' in x)}")
PY
echo "total $SECONDS s"
