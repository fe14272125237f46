#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round13c.sh OUT_DIR
# Eager decode of the Llama decoder (issue 14: tileship/PyTorch at batch 1 at most 1.0) with model_e2e.py
# timing the two models in turns, 9 rounds of 100 decode steps, and printing the paired ratio with its range
# (benchmarks/dev/gpu_next.sh eager: the catalog built and verified there, then model_e2e.py and
# dev/eager_profile.py). OUT_DIR/all_eager.tgz.
set -u
E2E_ARGS="--serving-only --iters 100 --repeats 9" bash benchmarks/dev/gpu_next.sh "${1:?usage: gpu_round13c.sh OUT_DIR}" eager
