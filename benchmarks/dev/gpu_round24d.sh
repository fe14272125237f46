#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round24d.sh OUT_DIR   (issue 12, round 24, call 7)
# W4A16 alone on the product path after down's tiling change (mv_config: 14 warps along K): build
# benchmarks/decode/w4a16.toml, tileship verify --grid 2, decode_kernels.py --ops w4a16_linear. Needs
# .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round24d.sh OUT_DIR}
d=/tmp/round24d; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rm -rf /tmp/w4-rel
python3 -m tileship.cli build --project benchmarks/decode/w4a16.toml --out /tmp/w4-rel -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -d /tmp/w4-rel/*/ | head -1)
t1=$(date +%s)
timeout "${VERIFY_TIMEOUT:-200}" python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" --grid 2 > "$d/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "M(4|8)_K14336" "$d/verify.log" | cut -c1-200 | head -8
t1=$(date +%s)
timeout "${KERNELS_TIMEOUT:-150}" python3 benchmarks/decode_kernels.py "$rel" --out "$d/decode_kernels.json" --ops w4a16_linear \
  > "$d/decode_kernels.log" 2>&1
echo "decode_kernels rc=$? ($(( $(date +%s) - t1 )) s)"
python3 - "$d/decode_kernels.json" <<'PY' 2>&1
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["M"] in (4, 8):
        s = r["speedup_vs"]
        print(f"{r['spec'][:50]:50s} {r['path']:7s} vs cuBLAS fp16 {s['cublas_fp16']['ratio']:.2f}"
              f" ({s['cublas_fp16']['resolved']}) vs torch int4 {s['torch_int4']['ratio']:.2f} err {r['rel_l2_err']:.1e}")
PY
xz -9 "$d/verification.json" "$d/verify.log" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
