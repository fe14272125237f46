#!/usr/bin/env bash
# Regenerate requirements-serve.txt: the serving side's hash-locked requirements (the runtime and the
# `serve` extra; no compiler, no test tools, no build farm), the tested versions of constraints.txt.
# Resolved against pypi.org alone (this machine's pip config adds a local wheel directory holding the
# CPU build of torch; the serving image needs the registry's CUDA build), with every file's sha256.
# The image installs it with `pip install --require-hashes --no-deps` (tileship image).
set -euo pipefail
cd "$(dirname "$0")/.."
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT
export PIP_CONFIG_FILE=/dev/null CUSTOM_COMPILE_COMMAND="scripts/lock-serve.sh"
.venv/bin/python -m piptools compile pyproject.toml --extra serve -c constraints.txt \
  --index-url https://pypi.org/simple --generate-hashes --strip-extras --allow-unsafe \
  --no-emit-index-url --no-emit-find-links --no-annotate --quiet --output-file requirements-serve.txt
