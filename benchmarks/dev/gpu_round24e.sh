#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round24e.sh OUT_DIR   (issue 12, round 24, call 8)
# The int4 decoder at context 8k, batch 8 and 1, with the MMA-GEMV: build the decode project, then decode_e2e
# without verify (the session's device minutes do not cover it): the release loads unverified, so every
# operator serves its kernel (pinned). Every W4A16 specialization routed to its kernel under evidence in call 5
# too; the fp16 path's ratio here is pinned, not evidence routing. Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round24e.sh OUT_DIR}
d=/tmp/round24e; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rm -rf /tmp/decode-rel
timeout 175 python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 \
  > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -d /tmp/decode-rel/*/ | head -1)
left=$(( ${BUDGET_S:-280} - SECONDS ))
t1=$(date +%s)
timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_8k.json" --contexts 8192 \
  --batches 8,1 --rms-eps 1e-6 --deadline-s $(( left - 15 )) > "$d/decode_e2e_8k.log" 2>&1
echo "decode_e2e 8k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_8k.log" | cut -c1-300 | tail -6
echo "total $(( $(date +%s) - t0 )) s"
