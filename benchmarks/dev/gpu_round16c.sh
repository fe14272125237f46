#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round16c.sh OUT_DIR   (issue 13, round 16, call 6)
# Call 5 (gpu_round16b.sh) with tune's host gauge on: the gauge was the default when call 6 ran
# (commit 46f85cb) and is off by default since, so it is asked for here.
TUNE_ARGS=--host-gauge exec bash "$(dirname "$0")/gpu_round16b.sh" "$@"
