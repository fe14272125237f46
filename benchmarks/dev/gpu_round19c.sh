#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round19c.sh OUT_DIR   (issue 13, round 19, call 4)
# Option B's whole loop at this tree (option_b_loop.py --device cuda --rollback): served load with undeclared shapes
# -> telemetry -> propose -> build on the host -> verify + tune -> canary -> promote; then a forced-slow canary that
# must roll back. The server needs starlette/uvicorn, which the slim TileLang bundle lacks: they travel as
# .gpu/serve_extra.tar.xz (made on this machine from the full bundle's wheels plus click and idna; carry it).
set -u
out=${1:?usage: gpu_round19c.sh OUT_DIR}
d=/tmp/round19c; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -f .gpu/serve_extra.tar.xz ] && tar -C /tmp/site -xJf .gpu/serve_extra.tar.xz
python3 -c "import starlette, uvicorn, orjson; print('serve packages ok')"
t0=$(date +%s)
timeout "${LOOP_TIMEOUT:-420}" python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop \
  --out "$d/loop.json" > "$d/loop.log" 2>&1
echo "option_b_loop rc=$? ($(( $(date +%s) - t0 )) s)"; tail -12 "$d/loop.log" | cut -c1-300
