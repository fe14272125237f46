#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round12a.sh OUT_DIR
# Round 12, first call: the W4A16 decode-batch kernels at M = 4, 8, 16, 32 (fp16, against cuBLAS fp16 and
# torch's int4 path): the catalog's rule (LOP3 decode, workspace split-K) beside the pair decode ("rsp")
# in one process, then the cluster split-K reduce ("rsc", one launch) in a second process, so that a
# fault in the new cluster kernel cannot take the first table with it.
set -u
out=${1:?usage: gpu_round12a.sh OUT_DIR}
t0=$(date +%s)
mkdir -p /tmp/site "$out" && tar -C /tmp/site -xJf .gpu/site.tar.xz && tar -C /tmp/site -xf .gpu/ascend.tar
export PYTHONPATH=/tmp/site:$PWD/src TILELANG_CACHE_DIR=/tmp/tlcache
echo "unpacked $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/nvidia-smi.csv" 2>&1
cd benchmarks/dev
timeout 230 python3 w4a16_sweep.py "$out/w4a16_sweep_pair.json" --ms 4,8,16,32 --kinds rule,rsp --jobs 15 \
  > "$out/w4a16_sweep_pair.log" 2>&1
echo "pair sweep rc=$? ($(( $(date +%s) - t0 )) s)"
timeout $(( 560 - ($(date +%s) - t0) )) python3 w4a16_sweep.py "$out/w4a16_sweep_cluster.json" --ms 4,8,16,32 \
  --kinds rule,rsc --jobs 15 > "$out/w4a16_sweep_cluster.log" 2>&1
echo "cluster sweep rc=$? ($(( $(date +%s) - t0 )) s)"
tail -3 "$out/w4a16_sweep_pair.log" "$out/w4a16_sweep_cluster.log" | cut -c1-300
