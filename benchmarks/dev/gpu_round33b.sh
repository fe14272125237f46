#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round33b.sh OUT_DIR   (issue 16, round 33)
# The 64-client throughput target (HTTP at least 0.8x the in-process loop, 4096^3 fp16 GEMM over binary HTTP) in
# interleaved rounds (gpu_round23a.sh) with the server's calls on THREADS worker threads (default 4; rounds 23-32 ran 1),
# then the same with 1, in one call, so that both sit on one warm host. Needs .gpu/site.tar.xz and .gpu/serve.tar.xz.
# OUT_DIR/threads{N,1}/all.tgz.
set -u
out=${1:?usage: gpu_round33b.sh OUT_DIR}
for th in "${THREADS:-4}" 1; do
  THREADS=$th bash benchmarks/dev/gpu_round23a.sh "$out/threads$th"
done
