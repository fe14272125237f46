# Sourced by the GPU-host scripts (benchmarks/gpu_*.sh): TileLang from the offline bundle when the
# host lacks it (.gpu/site.tar.xz, unpacked once into /tmp/site), tileship from this checkout, one
# TileLang cache dir, wide rich tables, and the GPU's clocks and temperature recorded in $1.
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('tilelang') is None)" && [ -f .gpu/site.tar.xz ]; then
  [ -d /tmp/site/tilelang ] || { mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz; }
  # the bundle's companion (carried beside it where the bundle lacks these files)
  [ -f .gpu/ascend.tar ] && tar -C /tmp/site -xf .gpu/ascend.tar
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tlcache} COLUMNS=${COLUMNS:-220}
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "${1:-/dev/null}" 2>&1
# what ran, by content (the host copy's .git can be stale): compare with `bash benchmarks/tree_digest.sh` on a commit
if [ -n "${1:-}" ]; then bash benchmarks/tree_digest.sh > "$(dirname "$1")/tree_digest.txt" 2>&1; fi
