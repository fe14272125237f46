#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round28a.sh OUT_DIR   (issue 12, round 28)
# The three decode paths end to end at context 1k, batch 8 and 1 (torch fp16, tileship fp16, tileship W4A16): build
# the decode project, then decode_e2e without verify (too few device minutes left for it): the release loads
# unverified, so every operator serves its kernel (pinned routing, as gpu_round24e.sh at 8k). Under evidence every
# W4A16 specialization routed to its kernel in round 24 call 5 and round 28 call 1. Needs .gpu/site.tar.xz. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round28a.sh OUT_DIR}
d=/tmp/round28a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rm -rf /tmp/decode-rel
timeout "${BUILD_TIMEOUT:-210}" python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 \
  > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -d /tmp/decode-rel/*/ | head -1)
left=$(( ${BUDGET_S:-330} - SECONDS ))
t1=$(date +%s)
timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_1k.json" --contexts 1024 \
  --batches "${BATCHES:-8,1}" --rms-eps 1e-6 --deadline-s $(( left - 15 )) > "$d/decode_e2e_1k.log" 2>&1
echo "decode_e2e 1k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_1k.log" | cut -c1-300 | tail -6
echo "total $(( $(date +%s) - t0 )) s"
