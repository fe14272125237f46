#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round3.sh OUT_DIR [TOOLCHAIN_RELEASE_DIR]
# 1) benchmarks/dev/gqa_sweep.py: gqa_decode's split count / KV tile / stages / threads vs SDPA
#    (issue 12: decode attention at batch 1), about 3 minutes
# 2) issue 18's smoke: a release built on the CPU machine through `tileship build --toolchain`
#    (the pip nvcc 13.0.88), loaded here with nvcc hidden from PATH (gpu_smoke.py: every CUDA
#    specialization called at its sample shapes, compared with the reference, compile attempts counted)
# Everything also lands in OUT_DIR/all.tgz (the device tool returns at most 8 files).
set -u
out=${1:?usage: gpu_round3.sh OUT_DIR [TOOLCHAIN_RELEASE_DIR]}
tcrel=${2:-}
mkdir -p "$out"
finish() { tar -C "$out" --exclude all.tgz -czf /tmp/round.tgz . && mv /tmp/round.tgz "$out/all.tgz"; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
if [ -n "$tcrel" ]; then
  PATH=/usr/bin:/bin timeout 120 python3 benchmarks/gpu_smoke.py --release "$tcrel" --out "$out/toolchain_smoke.json" \
    > "$out/toolchain_smoke.log" 2>&1
  echo "toolchain smoke rc=$?"; tail -4 "$out/toolchain_smoke.log"
fi
# 3) the output ABI (a development experiment, issue 14): the launch project built on the CPU machine
#    twice, TileLang's callee-allocated outputs (the default) vs outputs passed by the caller
#    (TILESHIP_DEV_CALLER_OUTPUTS=1 at build); runtime_overhead.py on each, alternated twice
#    (separate processes: not side by side in one process; read the spread)

i=0
for rep in 1 2; do
  for rel in ${ABI_RELEASES:-}; do
    i=$((i + 1)); name=$(basename "$(dirname "$rel")")_$rep
    timeout 90 python3 benchmarks/runtime_overhead.py --release "$rel" --device cuda --rounds 7 \
      --out "$out/abi_$name.json" > "$out/abi_$name.txt" 2>&1
    echo "abi $name rc=$?"; grep -E "^\S|kernel|torch|tilelang" "$out/abi_$name.txt" | head -16
  done
done
timeout $(( 575 - SECONDS )) python3 benchmarks/dev/gqa_sweep.py "$out/gqa_sweep.json" --jobs 15 > "$out/gqa_sweep.log" 2>&1
echo "gqa_sweep rc=$?"; grep -v "TileLang" "$out/gqa_sweep.log" | tail -60
