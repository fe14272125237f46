#!/usr/bin/env bash
# Build the offline Ray bundle for the GPU test host (CPython 3.12, x86-64, no network; see
# ../shared/GPU_HOST.md), in two parts that each fit one device call's carry next to the code:
#
#   bash benchmarks/dev/ray_host_bundle.sh        -> .gpu/ray_a.tar.xz, .gpu/ray_b.tar.xz (+ .gpu/ray.stamp)
#
# The parts are a byte split of ONE tar.xz; on the host: cat ray_a ray_b | tar -C /tmp/raysite -xJ
# (benchmarks/dev/gpu_ray.sh does it over two back-to-back calls). Contents: ray at the version the
# tests use here (constraints.txt), cp312 manylinux x86_64, plus the dependencies of ray's core that
# the host lacks (Requires-Dist of ray without extras: jsonschema and its four, msgpack, protobuf,
# packaging; filelock comes with .gpu/site.tar.xz, pyyaml and requests are on the host). Not click:
# the host's typer brings its own, and a newer click in front of it could break the tileship CLI.
# Stripped, since `tileship build --ray` never imports them: the Java jars, the dashboard's web
# client, and the libraries on top of Ray core (serve, data, train, tune, rllib, llm). So this
# bundle runs the build farm, not `serve --ray`.
# Rebuilt only when this script changes. .gpu/ stays out of git.
# For a CPU rehearsal of gpu_ray.sh on this machine's Python: PYVER=3.11 DEST=/tmp/raybundle311 (then
# RAY_BUNDLE_DIR=/tmp/raybundle311 bash benchmarks/dev/gpu_ray.sh ...).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
specs=(
  "ray==$(sed -n 's/^ray==//p' constraints.txt)"
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0
  msgpack==1.2.4
  protobuf==6.33.6
  packaging==26.4
)
part=$((40 * 1048576))  # each part plus the ~20 MB tracked tree stays under the 64 MiB carry
pyver=${PYVER:-3.12}
dest=${DEST:-.gpu}
mkdir -p "$dest"
stamp=$( (cat "$0" constraints.txt; echo "$pyver") | sha256sum | cut -c1-16)
if [ -f "$dest/ray_a.tar.xz" ] && [ "$(cat "$dest/ray.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "ray_host_bundle: $dest/ray_[ab].tar.xz are current"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$work/wheels" "${specs[@]}"
mkdir -p "$work/site"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
r="$work/site/ray"
rm -rf "$r/jars" "$r/dashboard/client/build" "$r/serve" "$r/data" "$r/train" "$r/tune" "$r/rllib" "$r/llm"
find "$work/site" -name __pycache__ -type d -prune -exec rm -rf {} +
# the console scripts pip would have made: `ray start` is `python3 -m ray.scripts.scripts start` here
tar -C "$work/site" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9e -T0 > "$work/ray.tar.xz"
rm -f "$dest"/ray_?.tar.xz
split -b "$part" -a 1 --additional-suffix=.tar.xz "$work/ray.tar.xz" "$work/ray_"
n=$(ls "$work"/ray_?.tar.xz | wc -l)
[ "$n" -le 2 ] || { echo "ray_host_bundle: $n parts, gpu_ray.sh expects 2" >&2; exit 1; }
[ -f "$work/ray_b.tar.xz" ] || : > "$work/ray_b.tar.xz"
mv "$work"/ray_a.tar.xz "$work"/ray_b.tar.xz "$dest"/
echo "$stamp" > "$dest/ray.stamp"
ls -l "$dest"/ray_a.tar.xz "$dest"/ray_b.tar.xz
echo "ray_host_bundle: cp${pyver/./} $(stat -c %s "$work/ray.tar.xz") bytes in 2 parts, sha256 $(sha256sum < "$work/ray.tar.xz" | cut -c1-16): ${specs[*]}"
