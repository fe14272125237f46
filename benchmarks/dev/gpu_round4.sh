#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round4.sh OUT_DIR TOOLCHAIN_RELEASE_DIR
# Round 3's files did not come back (more than 8 files under OUT; only all.tgz counts now):
# 1) issue 18's toolchain smoke again (gpu_smoke.py, nvcc hidden from PATH)
# 2) the decode project built here with outputs passed by the caller (TILESHIP_DEV_CALLER_OUTPUTS=1,
#    the output-ABI experiment), verify --grid 2: do workspace kernels (T.alloc_global) verify too?
# 3) gqa_sweep.py again, for its JSON
set -u
out=${1:?usage: gpu_round4.sh OUT_DIR TOOLCHAIN_RELEASE_DIR}
tcrel=${2:?}
d=/tmp/round4; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
PATH=/usr/bin:/bin timeout 120 python3 benchmarks/gpu_smoke.py --release "$tcrel" --out "$d/toolchain_smoke.json" \
  > "$d/toolchain_smoke.log" 2>&1
echo "toolchain smoke rc=$?"; tail -4 "$d/toolchain_smoke.log"
t0=$(date +%s)
TILESHIP_DEV_CALLER_OUTPUTS=1 timeout 150 python3 -m tileship.cli build --project benchmarks/decode/tileship.toml \
  --out /tmp/decode-caller -j 16 > "$d/build_caller.log" 2>&1; echo "build rc=$? ($(( $(date +%s) - t0 )) s)"
rel=$(ls -td /tmp/decode-caller/*/ | head -1)
grep -l '"callee_allocated_outputs": true' "$rel"/specs/*/artifact.json 2>/dev/null | wc -l
timeout 150 python3 -m tileship.cli verify "$rel" --grid 2 --json-out "$d/verification_caller.json" > "$d/verify_caller.log" 2>&1
echo "verify rc=$?"; grep -cE "│ passed" "$d/verify_caller.log"; grep -E "│ (failed|error)" "$d/verify_caller.log" | head
timeout $(( 330 - SECONDS )) python3 benchmarks/dev/gqa_sweep.py "$d/gqa_sweep.json" --jobs 15 > "$d/gqa_sweep.log" 2>&1
echo "gqa_sweep rc=$?"; grep -E "^B=|catalog" "$d/gqa_sweep.log"
