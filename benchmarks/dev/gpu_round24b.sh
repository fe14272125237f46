#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round24b.sh OUT_DIR [MS] [KINDS] [OPS]   (issue 12, round 24)
# The W4A16 MMA-GEMV (catalog/w4a16_mma.py: weights streamed straight to registers as the M=1 GEMV does,
# mma.sync m16n8k16 on the decoded fragments, K split across the warps of a block, one launch) beside the
# catalog's rule kernel and cuBLAS fp16, every variant checked against float32 (w4a16_sweep.py kind "mv").
# Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round24b.sh OUT_DIR [MS] [KINDS] [OPS]}
ms=${2:-8,32}; kinds=${3:-mv,rule}; ops=${4:-qkv,o,gate_up,down,lm_head}
d=/tmp/round24b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
t0=$(date +%s)
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
(cd benchmarks/dev && timeout "${SWEEP_TIMEOUT:-500}" python3 w4a16_sweep.py "$d/w4a16_sweep_mv.json" \
  --ms "$ms" --kinds "$kinds" --ops "$ops" --jobs 16 > "$d/w4a16_sweep_mv.log" 2>&1)
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^compiled|^copy" "$d/w4a16_sweep_mv.log"
python3 - "$d/w4a16_sweep_mv.json" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    c = r["candidates"]
    mv = [x for x in c if x["kind"].startswith("mv") and "us" in x]
    bad = [x for x in mv if x["relerr"] >= 2e-2]
    best = min((x for x in mv if x["relerr"] < 2e-2), key=lambda x: x["us"], default=None)
    rule = next((x for x in c if x["kind"] == "rule" and "us" in x), None)
    errs = [x for x in c if x["kind"].startswith("mv") and "error" in x]
    print(f"{r['op']:8s} M={r['M']:3d} cuBLAS {r['cublas_fp16_us']:7.1f}  rule {rule['us'] if rule else float('nan'):7.1f}"
          f"  mv best {best['us'] if best else float('nan'):7.1f} ({best['cfg'] if best else None}, "
          f"{best['tbps'] if best else 0:.2f} TB/s)  x{r['cublas_fp16_us'] / best['us'] if best else 0:.2f}"
          f"  wrong {len(bad)} failed {len(errs)} of {len(mv) + len(errs)}")
PY
echo "total $SECONDS s"
