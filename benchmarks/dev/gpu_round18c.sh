#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round18c.sh OUT_DIR   (issues 12 and 14, round 18, call 3)
# Reuses calls 1-2's releases when the host kept /tmp (else builds + verifies the decode project again):
# decode_e2e at context 8k (batches 1, 8, 32) and at 1k batch 32; then, when the tuned release is still there,
# a second eager run of model_e2e (the same arguments as call 2) to see how far the eager ratio moves between runs.
set -u
out=${1:?usage: gpu_round18c.sh OUT_DIR}
d=/tmp/round18c; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
rel=$(ls -d /tmp/decode-rel/*/ 2>/dev/null | head -1)
if [ -z "$rel" ] || [ ! -f "$rel/evidence/verification.json" ]; then
  echo "no decode release kept: building again"
  python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 > "$d/build.log" 2>&1
  rel=$(ls -d /tmp/decode-rel/*/ | head -1)
  timeout 240 python3 -m tileship.cli verify "$rel" --grid 2 > "$d/verify.log" 2>&1; echo "verify rc=$?"
fi
echo "decode release $rel ($SECONDS s)"
left=$(( 470 - SECONDS ))
timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_8k.json" --contexts 8192 \
  --batches 1,8,32 --rms-eps 1e-6 --require-evidence --deadline-s $(( left - 40 )) > "$d/decode_e2e_8k.log" 2>&1
echo "decode_e2e 8k rc=$? ($SECONDS s)"; grep -E "ratio|FAIL" "$d/decode_e2e_8k.log" | cut -c1-300 | tail -6
left=$(( 500 - SECONDS ))
[ "$left" -gt 60 ] && timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_b32.json" \
  --contexts 1024 --batches 32 --rms-eps 1e-6 --require-evidence --deadline-s 10 > "$d/decode_e2e_b32.log" 2>&1
echo "decode_e2e 1k b32 rc=$? ($SECONDS s)"; grep -E "ratio|FAIL" "$d/decode_e2e_b32.log" | cut -c1-300 | tail -3
trel=$(ls -td /tmp/tuned-rel/*/ 2>/dev/null | head -1)
left=$(( 570 - SECONDS ))
if [ -n "$trel" ] && [ -f "$trel/evidence/verification.json" ] && [ "$left" -gt 50 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD timeout "$left" python3 benchmarks/model_e2e.py --release "$trel" \
    --out "$d/model_e2e_eager2.json" --modes eager --decode-batches 1,8 --require-evidence --serving-only --iters 100 \
    --repeats 9 > "$d/model_e2e_eager2.log" 2>&1
  echo "model_e2e eager (2nd) rc=$? ($SECONDS s)"; grep -E "paired" "$d/model_e2e_eager2.log" | tail -6
else
  echo "tuned release not kept or no time ($left s): no second eager run"
fi
