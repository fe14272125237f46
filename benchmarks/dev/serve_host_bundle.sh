#!/usr/bin/env bash
# Build .gpu/serve.tar.xz: what `tileship serve` (HTTP, --grpc-port, --workers) and the load scripts'
# clients (benchmarks/serve_load.py, serve_grpc_load.py, serve_workers.py, serve_shm.py; cuda-bindings for
# tritonclient.utils.cuda_shared_memory, driver-only, CUDA 13.0 like the host's torch) need on the GPU host that
# the host lacks (../shared/GPU_HOST.md). The TileLang bundle (.gpu/site.tar.xz) is separate.
#
#   bash benchmarks/dev/serve_host_bundle.sh        # from the repo root, on a machine with PyPI access
#
# cp312 manylinux x86_64 wheels, fetched WITHOUT dependencies (every one is listed below), pinned to
# constraints.txt. Left out on purpose: fastapi/pydantic (nothing imports them), uvloop (the server runs
# grpc.aio on asyncio's own loop), ml-dtypes, numpy, urllib3, httpx (on the host). click (uvicorn imports it; typer
# vendors its own, so the host may lack it) and packaging (tritonclient.grpc imports it; on the host
# through pytest and matplotlib) travel anyway.
# Reproducible: sorted names, fixed mtimes and owners, single-threaded xz; the sha256 is printed.
# On the GPU host: mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; PYTHONPATH=/tmp/serve:...
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
specs=(
  starlette==1.10.0 anyio==4.16.0 idna==3.20 typing_extensions==4.16.0
  uvicorn==0.54.0 h11==0.16.0 httptools==0.9.0 click==8.5.1
  orjson==3.13.0 prometheus-client==0.26.0
  grpcio==1.85.3 protobuf==6.33.6 tritonclient==2.73.0 python-rapidjson==1.25 packaging==26.4
  cuda-bindings==13.0.3 cuda-pathfinder==1.9.1
)
mkdir -p .gpu
stamp=$(printf '%s\n' "${specs[@]}" | sort | sha256sum | cut -c1-16)
if [ -f .gpu/serve.tar.xz ] && [ "$(cat .gpu/serve.stamp 2>/dev/null)" = "$stamp" ]; then
  echo "serve_host_bundle: .gpu/serve.tar.xz is current ($(du -h .gpu/serve.tar.xz | cut -f1), sha256 $(sha256sum .gpu/serve.tar.xz | cut -c1-16))"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plats=()
for n in 17 24 27 28 31 34 35; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
plats+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plats[@]}" -d "$work/wheels" "${specs[@]}"
mkdir -p "$work/site"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
# the tritonclient wheel carries perf_analyzer/perf_client binaries (tens of MB): no use here
rm -rf "$work/site/bin" "$work/site"/tritonclient-*.data
ls "$work/wheels" > "$work/site/SERVE_BUNDLE_WHEELS.txt"
tar -C "$work/site" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . | xz -9 -T1 > .gpu/serve.tar.xz.tmp
mv .gpu/serve.tar.xz.tmp .gpu/serve.tar.xz
echo "$stamp" > .gpu/serve.stamp
size=$(stat -c %s .gpu/serve.tar.xz)
echo "serve_host_bundle: wrote .gpu/serve.tar.xz ($((size / 1048576)) MiB, sha256 $(sha256sum .gpu/serve.tar.xz | cut -c1-16)) with: ${specs[*]}"
if [ "$size" -gt $((40 * 1048576)) ]; then
  echo "serve_host_bundle: WARNING over 40 MiB; with the code it may not fit the 64 MiB a call can carry" >&2
  exit 1
fi
