#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round19b.sh OUT_DIR   (issue 12, round 19, call 2)
# The decode project at this tree (gqa_decode now declares B=16 at 1k and 8k): build, tileship verify --grid 2,
# then decode_e2e (compile + CUDA graph) at context 1k, batches 16 and 32, then context 8k, batches 1, 8 and 32
# with the time left. The release stays in /tmp/decode-rel (gpu_round19c.sh reuses it on a warm machine).
set -u
out=${1:?usage: gpu_round19b.sh OUT_DIR}
d=/tmp/round19b; mkdir -p "$d" "$out"
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
timeout "${VERIFY_TIMEOUT:-260}" python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" --grid 2 \
  > "$d/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "passed|failed|evidence written" "$d/verify.log" | tail -3
grep -E "gqa_decode\.(float16|bfloat16).*B=(16|32)" "$d/verify.log" | cut -c1-220 | head -12
t1=$(date +%s)
left=$(( 480 - SECONDS ))
timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_1k.json" --contexts 1024 \
  --batches 16,32 --rms-eps 1e-6 --require-evidence --deadline-s $(( left - 20 )) > "$d/decode_e2e_1k.log" 2>&1
echo "decode_e2e 1k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_1k.log" | cut -c1-300 | tail -6
left=$(( 585 - SECONDS ))
if [ "$left" -gt 60 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_8k.json" --contexts 8192 \
    --batches 1,8,32 --rms-eps 1e-6 --require-evidence --deadline-s $(( left - 25 )) > "$d/decode_e2e_8k.log" 2>&1
  echo "decode_e2e 8k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_8k.log" | cut -c1-300 | tail -6
fi
xz -9 "$d/verification.json" "$d/verify.log" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
