#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round33a.sh OUT_DIR   (issue 12, round 33)
# The warpgroup-MMA W4A16 kernel (catalog/w4a16_wgmma.py, new): first which descriptor reading is correct on this
# GPU (benchmarks/dev/wg_probe.py, each reading in its own process), then the sweep (w4a16_sweep.py kind "wg" with
# that reading, beside the catalog's pick and cuBLAS fp16) at M = 8 and 32 (MS=...) on down and gate_up (OPS=...).
# Needs .gpu/site.tar.xz carried. OUT_DIR/wg.tgz.
set -u
out=${1:?usage: gpu_round33a.sh OUT_DIR}
d=/tmp/round33a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/wg.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
timeout "${PROBE_TIMEOUT:-150}" python3 benchmarks/dev/wg_probe.py "$d/probe" > "$d/probe.log" 2>&1
echo "probe rc=$? ($SECONDS s)"; cut -c1-220 "$d/probe.log" | grep -v INFO | tail -12
[ -f "$d/probe/wg_layout.txt" ] || { echo "no correct reading: no sweep"; exit 0; }
export WG_LAYOUT; WG_LAYOUT=$(cat "$d/probe/wg_layout.txt")
(cd benchmarks/dev && timeout "${SWEEP_TIMEOUT:-240}" python3 w4a16_sweep.py "$d/sweep.json" --ms "${MS:-32,8}" \
  --kinds wg,catalog --ops "${OPS:-down,gate_up}" --jobs 16 > "$d/sweep.log" 2>&1)
echo "sweep rc=$? ($SECONDS s)"; grep -E "^compiled|^copy" "$d/sweep.log"
python3 - "$d/sweep.json" <<'PY' 2>&1 | tee "$d/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    c = [x for x in r["candidates"] if x["dtype"] == "float16" and "us" in x]
    ok = [x for x in c if x["relerr"] < 2e-2]
    cat = next((x for x in ok if x["kind"] == "catalog"), None)
    wg = sorted((x for x in ok if x["kind"] == "wg"), key=lambda x: x["us"])
    print(f"{r['op']:8s} M={r['M']:2d} cuBLAS {r['cublas_fp16_us']:6.2f} {[round(v, 2) for v in r['cublas_p10_p90']]} "
          f"catalog {cat['us'] if cat else 0:6.2f} {[round(v, 2) for v in cat['p10_p90']] if cat else ''} "
          f"(x{r['cublas_fp16_us'] / cat['us'] if cat else 0:.2f}) wrong {len(c) - len(ok)} failed "
          f"{sum(1 for x in r['candidates'] if 'error' in x)}")
    for x in wg[:4]:
        print(f"    wg {x['us']:6.2f} {[round(v, 2) for v in x['p10_p90']]} {x['cfg']} {x['tbps']:.2f} TB/s "
              f"x{r['cublas_fp16_us'] / x['us']:.2f}")
PY
echo "total $SECONDS s"
