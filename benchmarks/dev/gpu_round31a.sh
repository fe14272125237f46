#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round31a.sh OUT_DIR   (issue 12, round 31)
# W4A16 GEMV at M = 1..3 with its weights and scales streamed through a cp.async ring of D K steps a warp
# (w4a16_sweep.py kind "gemv3a", w4a16_gemv3(depth=D), catalog/w4a16_async.py) beside gemv3's register loads
# (kind "gemv3"), the catalog's pick and cuBLAS fp16 / torch int4; fp16 at M=1,2 and bf16 at M=1 (down, gate_up), every
# variant checked against float32. Needs .gpu/site.tar.xz carried. OUT_DIR/sweep.tgz.
set -u
out=${1:?usage: gpu_round31a.sh OUT_DIR}
d=/tmp/round31a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/sweep.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
summary() {
python3 - "$1" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    for dt in ("float16", "bfloat16"):
        c = [x for x in r["candidates"] if x["dtype"] == dt and "us" in x]
        if not c:
            continue
        bad = [x for x in c if x["relerr"] >= 2e-2]
        ok = [x for x in c if x["relerr"] < 2e-2]
        cat = next((x for x in ok if x["kind"] == "catalog"), None)
        best = {k: min((x for x in ok if x["kind"] == k), key=lambda x: x["us"], default=None) for k in ("gemv3", "gemv3a")}
        a, g = best["gemv3a"], best["gemv3"]
        print(f"{r['op']:8s} M={r['M']} {dt[:4]} cuBLAS {r['cublas_fp16_us']:6.1f} catalog {cat['us'] if cat else 0:6.2f} "
              f"{cat['p10_p90'] if cat else ''} gemv3 {g['us'] if g else 0:6.2f} gemv3a {a['us'] if a else 0:6.2f} "
              f"{[round(v, 2) for v in a['p10_p90']] if a else ''} {a['cfg'] if a else ''} {a['tbps'] if a else 0:.2f} TB/s "
              f"x{r['cublas_fp16_us'] / a['us'] if a else 0:.2f} wrong {len(bad)}")
PY
}
(cd benchmarks/dev && timeout "${SWEEP_TIMEOUT:-260}" python3 w4a16_sweep.py "$d/fp16.json" --ms "${MS:-1,2}" \
  --kinds gemv3a,gemv3,catalog --ops "${OPS:-down,gate_up,qkv,o,lm_head}" --jobs 16 > "$d/fp16.log" 2>&1)
echo "fp16 sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/fp16.log"; summary "$d/fp16.json"
(cd benchmarks/dev && timeout "${BF16_TIMEOUT:-150}" python3 w4a16_sweep.py "$d/bf16.json" --ms 1 --bf16 \
  --kinds gemv3a,gemv3,catalog --ops "${BF16_OPS:-down,gate_up}" --jobs 16 > "$d/bf16.log" 2>&1)
echo "bf16 sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/bf16.log"; summary "$d/bf16.json"
echo "total $SECONDS s"
