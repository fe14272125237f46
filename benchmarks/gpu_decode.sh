#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/gpu_decode.sh OUT_DIR
#   1) tileship build of benchmarks/decode/tileship.toml (w4a16_linear, gqa_decode, rmsnorm; sm_90a)
#   2) tileship verify (evidence: correctness vs float64 + kernel vs reference timing) and report
#   3) benchmarks/decode_kernels.py: the kernels vs cuBLAS fp16, torch's int4 path and SDPA
# Knobs: JOBS (build parallelism), VERIFY_ARGS, DK_ARGS.
set -u
out=${1:?usage: gpu_decode.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j "${JOBS:-16}" \
  > "$out/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 "$out/build.log"
rel=$(ls -d /tmp/decode-rel/*/ | head -1)
t0=$(date +%s)
# shellcheck disable=SC2086
python3 -m tileship.cli verify "$rel" --json-out "$out/verification.json" ${VERIFY_ARGS:-} > "$out/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|failed|evidence written" "$out/verify.log" | tail -5
python3 -m tileship.cli report "$rel" --out "$out/report" > "$out/report.log" 2>&1; echo "report rc=$?"
t0=$(date +%s)
# shellcheck disable=SC2086
python3 benchmarks/decode_kernels.py "$rel" --out "$out/decode_kernels.json" ${DK_ARGS:-} > "$out/decode_kernels.log" 2>&1
echo "decode_kernels rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 "$out/decode_kernels.log"
echo "$rel" > "$out/release_path.txt"
