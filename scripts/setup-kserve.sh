#!/usr/bin/env bash
# The KServe Python SDK's clients for tests/test_serve_kserve.py, in an environment of their own:
# kserve 0.21.0 pins python-dateutil<3, which the server's tested set (constraints.txt) does not allow.
# Idempotent; run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want="kserve==0.21.0"
if [ "$(cat .venv-kserve/.tileship-installed 2>/dev/null)" != "$want" ]; then
  rm -rf .venv-kserve
  "$PY" -m venv .venv-kserve
  .venv-kserve/bin/python -m pip install -q "$want"
  echo "$want" > .venv-kserve/.tileship-installed
fi
