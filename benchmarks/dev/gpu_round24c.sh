#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round24c.sh OUT_DIR   (issue 12, round 24, call 5)
# The decode project with the MMA-GEMV serving W4A16 at M = 4..8 (w4a16_linear, round 24): build, tileship verify
# --grid 2 (both dtypes checked against float64 and timed against the reference), decode_kernels.py on
# w4a16_linear (each shape vs cuBLAS fp16 and torch's int4 path, side by side), then decode_e2e (compile + CUDA
# graph) at context 1k, batches 1 and 8, with the time left. Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round24c.sh OUT_DIR}
d=/tmp/round24c; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rm -rf /tmp/decode-rel
python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -d /tmp/decode-rel/*/ | head -1)
t1=$(date +%s)
timeout "${VERIFY_TIMEOUT:-230}" python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" --grid 2 \
  > "$d/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "passed|failed|evidence written" "$d/verify.log" | tail -3
grep -E "w4a16_linear\.(float16|bfloat16)\.M(4|8)_" "$d/verify.log" | cut -c1-200 | head -20
t1=$(date +%s)
left=$(( 560 - SECONDS )); [ "$left" -gt 120 ] && left=120
timeout "$left" python3 benchmarks/decode_kernels.py "$rel" --out "$d/decode_kernels.json" --ops w4a16_linear \
  > "$d/decode_kernels.log" 2>&1
echo "decode_kernels rc=$? ($(( $(date +%s) - t1 )) s)"
python3 - "$d/decode_kernels.json" <<'PY' 2>&1
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["M"] in (1, 4, 8, 32) and r["dtype"] == "float16":
        s = r["speedup_vs"]
        print(f"{r['spec'][:48]:48s} {r['path']:9s} vs cuBLAS fp16 {s['cublas_fp16']['ratio']:.2f}"
              f" (resolved {s['cublas_fp16']['resolved']}) vs torch int4 {s['torch_int4']['ratio']:.2f}"
              f" err {r['rel_l2_err']:.1e}")
PY
left=$(( 585 - SECONDS ))
if [ "$left" -gt 90 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_1k.json" --contexts 1024 \
    --batches 8,1 --rms-eps 1e-6 --require-evidence --deadline-s $(( left - 20 )) > "$d/decode_e2e_1k.log" 2>&1
  echo "decode_e2e 1k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_1k.log" | cut -c1-300 | tail -8
fi
xz -9 "$d/verification.json" "$d/verify.log" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
