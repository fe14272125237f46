#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round18a.sh OUT_DIR   (issue 12, round 18, call 1)
# The decode project with the swapped-operand linear at M=4-16 (catalog/gemv.py: linear_decode): build, verify,
# report (benchmarks/gpu_decode.sh without decode_kernels), then decode_e2e at batches 1, 8 and 16, context 1k
# (compile + CUDA graph). The decode folder is packed into decode.tgz (the device returns at most 8 files).
set -u
out=${1:?usage: gpu_round18a.sh OUT_DIR}
mkdir -p "$out/decode"
t0=$(date +%s)
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/decode/nvidia-smi.csv"
python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j "${JOBS:-16}" \
  > "$out/decode/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/decode/build.log"
rel=$(ls -d /tmp/decode-rel/*/ | head -1)
echo "$rel" > "$out/decode/release_path.txt"
t1=$(date +%s)
timeout "${VERIFY_TIMEOUT:-240}" python3 -m tileship.cli verify "$rel" --json-out "$out/decode/verification.json" \
  --grid 2 > "$out/decode/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "passed|failed|evidence written" "$out/decode/verify.log" | tail -3
grep -E "linear\.(float16|bfloat16)" "$out/decode/verify.log" | cut -c1-220 | head -60
timeout 60 python3 -m tileship.cli report "$rel" --out "$out/decode/report" > "$out/decode/report.log" 2>&1
echo "report rc=$?"
t2=$(date +%s)
left=$(( 588 - SECONDS ))
timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$out/decode/decode_e2e.json" \
  --contexts 1024 --batches "${BATCHES:-1,8,16}" --rms-eps 1e-6 --require-evidence --deadline-s "$(( left - 15 ))" \
  > "$out/decode/decode_e2e.log" 2>&1
echo "decode_e2e rc=$? ($(( $(date +%s) - t2 )) s)"; grep -E "ratio|FAIL|wrote|linear" "$out/decode/decode_e2e.log" | cut -c1-400 | tail -14
xz -9 "$out/decode/verification.json" "$out/decode/verify.log" 2>/dev/null
tar -C "$out" -czf "$out/decode.tgz" decode && rm -rf "$out/decode"
echo "total $(( $(date +%s) - t0 )) s"
