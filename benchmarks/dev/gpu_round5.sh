#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round5.sh OUT_DIR STAGE [TOOLCHAIN_RELEASE_DIR]
#   STAGE=a: issue 18's toolchain smoke (gpu_smoke.py with every CUDA directory taken off PATH, so no
#            nvcc can run), then the decode project (kv_append, kv_append_paged and the fp16 linear GEMV
#            included): build -j 16, verify --grid 8, decode_e2e.py in the time left
#   STAGE=b: bash benchmarks/gpu_tune.sh DIR all (Option B tune + served_vs_best + runtime_overhead)
# Only OUT_DIR/all_STAGE.tgz comes back (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_round5.sh OUT_DIR a|b [TOOLCHAIN_RELEASE_DIR]}
stage=${2:?}
d=/tmp/round5$stage; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all_$stage.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
if [ "$stage" = a ]; then
  nocuda=$(echo "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)
  PATH=$nocuda command -v nvcc > "$d/nvcc_visible.txt" 2>&1; echo "nvcc on the smoke's PATH: $(cat "$d/nvcc_visible.txt")"
  PATH=$nocuda timeout 120 python3 benchmarks/gpu_smoke.py --release "${3:?}" --out "$d/toolchain_smoke.json" \
    > "$d/toolchain_smoke.log" 2>&1
  echo "toolchain smoke rc=$?"; tail -3 "$d/toolchain_smoke.log"
  t0=$(date +%s)
  timeout 220 python3 -m tileship.cli build --project benchmarks/decode/tileship.toml --out /tmp/decode-rel -j 16 \
    > "$d/build.log" 2>&1; echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
  rel=$(ls -td /tmp/decode-rel/*/ | head -1)
  timeout 200 python3 -m tileship.cli verify "$rel" --grid 8 --json-out "$d/verification.json" > "$d/verify.log" 2>&1
  echo "verify rc=$? ($SECONDS s in)"; grep -cE "│ passed" "$d/verify.log"; grep -E "│ (failed|error)" "$d/verify.log" | head
  grep -E "^│ (kv_append|linear)" "$d/verify.log" | cut -c1-160 | head -40
  left=$(( ${END_S:-500} - SECONDS ))
  [ "$left" -gt 60 ] && timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --deadline-s $(( left - 30 )) \
    --rms-eps 1e-6 --require-evidence --out "$d/decode_e2e.json" > "$d/decode_e2e.log" 2>&1
  echo "decode_e2e rc=$?"; grep -E "^decode_|FAIL|linear" "$d/decode_e2e.log" | cut -c1-200 | head -20
else
  bash benchmarks/gpu_tune.sh "$d" all
fi
