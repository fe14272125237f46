#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round24a.sh OUT_DIR   (issues 13 and 16, round 24, call 1)
# Two runs prepared on the CPU machine, in one call:
#   1. Option B's loop with the forced-slow canary (gpu_round22a.sh) at a tree with the canary's blind rule
#      (2e402b3, 08ba135: never promoted unseen; roll back after 4 windows), which round 22's loop ran before;
#   2. the 64-client throughput target in interleaved rounds (gpu_round23a.sh: serve_load_rounds.py).
# Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. OUT_DIR/loop/all.tgz and OUT_DIR/rounds/all.tgz.
set -u
out=${1:?usage: gpu_round24a.sh OUT_DIR}
mkdir -p "$out/loop" "$out/rounds"
bash benchmarks/tree_digest.sh > "$out/tree_digest.txt" 2>/dev/null
echo "== loop"; bash benchmarks/dev/gpu_round22a.sh "$out/loop"
echo "== rounds"; bash benchmarks/dev/gpu_round23a.sh "$out/rounds"
echo "total $SECONDS s"
