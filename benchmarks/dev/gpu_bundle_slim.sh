#!/usr/bin/env bash
# This machine, repo root: bash benchmarks/dev/gpu_bundle_slim.sh [serve]
# A device call carries 64 MiB in all and the tracked files take about 23 MiB, so the full bundle of
# ../shared/tools/gpu-host-bundle (49 MiB) no longer fits. This rebuilds .gpu/site.tar.xz from it without
# what a GPU-host run of the catalog needs least: the server packages (starlette, fastapi, uvicorn, h11,
# httptools, pydantic, anyio, opentelemetry), z3's executable, TVM's C++ sources and CUTLASS's tools
# (TileLang still compiles: CUTLASS's headers and TVM's Python stay): about 37 MiB. The full bundle is kept
# as .gpu/full.tar.xz. With "serve" it keeps the server packages and drops TileLang and z3 instead (9 MiB):
# enough to serve a release whose operator modules do not import TileLang at the top.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# the spec list's stamp, computed as gpu-host-bundle computes it
stamp=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' gpu-host-requirements.txt | grep -v '^$' | sort | sha256sum | cut -c1-16)
if [ ! -f .gpu/full.tar.xz ] || [ "$(cat .gpu/full.stamp 2>/dev/null)" != "$stamp" ]; then
  rm -f .gpu/site.stamp  # site.tar.xz may be a trimmed one: build the full bundle afresh
  ../shared/tools/gpu-host-bundle
  mv .gpu/site.tar.xz .gpu/full.tar.xz && echo "$stamp" > .gpu/full.stamp
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -C "$work" -xJf .gpu/full.tar.xz
if [ "${1:-}" = serve ]; then
  (cd "$work" && rm -rf tilelang tilelang-* z3 z3_solver-*)
else
  (cd "$work" && rm -rf starlette* fastapi* uvicorn* h11* httptools* pydantic* anyio* opentelemetry* annotated_doc* \
    annotated_types* typing_inspection* z3_solver-*.data tilelang/3rdparty/cutlass/tools tilelang/3rdparty/tvm/src)
fi
# Both: torch-c-dlpack-ext's prebuilt addons (built for torch 2.4-2.9 only: the host's torch
# 2.11 exports DLPack through its own __dlpack_c_exchange_api__, and the package loads none of them there); z3's
# second copy of its library, a symlink instead (xz -T0 compresses in blocks and would keep both).
# (tvm-ffi's libtvm_ffi_testing.so stays: tvm_ffi loads it at import)
(cd "$work" && rm -f torch_c_dlpack_ext/libtorch_c_dlpack_addon_*.so \
  && if [ -f z3/lib/libz3.so.4.15 ]; then rm -f z3/lib/libz3.so && ln -s libz3.so.4.15 z3/lib/libz3.so; fi)
if [ "${1:-}" != serve ] && command -v nvcc > /dev/null; then
  export LC_ALL=C
  # CUTLASS/CuTe headers: keep those TileLang's CUDA templates include (nvcc -M over every template header for
  # sm_90a; generated kernels include only these templates and cuda.h), drop the rest (conv, epilogue, gemm, ...)
  tl=$work/tilelang; inc=$tl/3rdparty/cutlass/include
  (cd "$tl/src" && find tl_templates/cuda -name '*.h' | grep -v -e sm100 -e tcgen -e nvrtc_std | sort \
    | sed 's/.*/#include "&"/') > "$work/all_templates.cu"
  nvcc -M -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I"$tl/src" -I"$inc" -x cu "$work/all_templates.cu" -o "$work/deps.txt"
  tr ' \\' '\n\n' < "$work/deps.txt" | grep -F "$inc/" | xargs -n1 realpath -m | sort -u > "$work/keep.txt"
  find "$inc" -type f | sort | comm -23 - "$work/keep.txt" | xargs rm -f
  echo "gpu_bundle_slim: kept $(wc -l < "$work/keep.txt") CUTLASS/CuTe headers"
  rm -f "$work/all_templates.cu" "$work/deps.txt" "$work/keep.txt"
  # TileLang's own C++ sources (its libraries are prebuilt) and the headers of other backends
  find "$tl/src" \( -name '*.cc' -o -name '*.cpp' \) -delete
  rm -rf "$tl/src/ascend" "$tl/src/rocm" "$tl/src/metal" "$tl/src/webgpu" "$tl/src/tl_templates/hip" \
    "$tl/src/tl_templates/ascend"
fi
[ -n "${KEEP_SLIM_TREE:-}" ] && rm -rf "$KEEP_SLIM_TREE" && cp -a "$work" "$KEEP_SLIM_TREE"
tar -C "$work" -cf - . | xz -9 -T0 > .gpu/site.tar.xz.tmp
mv .gpu/site.tar.xz.tmp .gpu/site.tar.xz
rm -f .gpu/site.stamp  # gpu-host-bundle must not take the trimmed file for the full one
echo "gpu_bundle_slim: .gpu/site.tar.xz $(du -h .gpu/site.tar.xz | cut -f1) (${1:-catalog}); full bundle in .gpu/full.tar.xz"
