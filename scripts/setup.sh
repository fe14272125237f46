#!/usr/bin/env bash
# Create .venv and install tileship with the tested set of dependencies (constraints.txt pins what
# pyproject.toml declares as ranges). Idempotent.
# torch is installed first and pinned to 2.13.0 (the CPU build on this machine's disk);
# a range would pull a multi-GB CUDA build from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.tileship-installed
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==2.13.0"
  # ray: tests/test_build_ray.py runs, never skips, here and in CI; build: pip-tools for tileship toolchain
  python -m pip install -q -c constraints.txt -e ".[serve,test,ray,build]"
  echo "$want" > "$stamp"
fi
