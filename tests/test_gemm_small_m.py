"""The swapped-operand small-M GEMM (catalog/gemm_small_m.py): its shape checks, its place among
``gemm_tuned``'s candidates, and a real nvcc build with a dynamic M on this machine (no GPU: whether it
is correct and faster than cuBLAS is decided by ``tileship tune`` on the H200)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tilelang")

from tileship.catalog import gemm_small_m, gemm_tuned  # noqa: E402
from tileship.declare.spec import expand  # noqa: E402

SWAPS = {"block_M16-block_N64-block_K128-num_stages8-threads128-swap1",
         "block_M32-block_N64-block_K128-num_stages8-threads128-swap1",
         "block_M8-block_N128-block_K128-num_stages3-threads128-swap1"}


@pytest.mark.parametrize(("n", "k", "cfg", "words"), [
    (4100, 4096, (16, 64, 128, 4, 1), "N % 64"),
    (4096, 4000, (16, 64, 128, 4, 1), "K % 128"),
    (4096, 4096, (16, 64, 128, 4, 64), "K % 8192"),  # split K must leave whole K tiles
    (4096, 4096, (12, 64, 128, 4, 1), "block_M=12"),
    (4032, 4096, (16, 96, 128, 4, 1), "block_N=96"),  # 4032 = 42 x 96
    (4096, 4096, (64, 128, 256, 4, 1), "do not fit"),
])
def test_a_tile_that_cannot_cover_the_shape_is_refused(n, k, cfg, words) -> None:
    with pytest.raises(ValueError, match=words):
        gemm_small_m.check(n, k, *cfg)
    with pytest.raises(ValueError, match=words):  # the factory checks before it traces anything
        gemm_small_m.matmul_swap(8, n, k, "float16", *cfg[:4], 128, cfg[4])


def test_the_tuned_gemm_declares_the_swapped_candidates_for_every_shape() -> None:
    specs = expand(gemm_tuned.gemm_tuned)
    for cand in SWAPS:
        mine = [s for s in specs if s.candidate == cand]
        assert len(mine) == len(specs) // 8, cand  # every (N, K) range and static shape, both dtypes
        assert dict(mine[0].config)["swap"] == 1


_DYNAMIC_M = """
import sys
import tilelang
import tilelang.language as T
from tileship.catalog import gemm_small_m
kernel = tilelang.compile(gemm_small_m.matmul_swap(T.dynamic("m"), 4096, 4096, "bfloat16", 16, 64, 128, 4, 128,
                                                   int(sys.argv[1])), out_idx=[2],
                          target={"kind": "cuda", "arch": "sm_90a"})
sys.stdout.write(kernel.get_kernel_source())
"""


@pytest.mark.parametrize("split_k", [1, 2])
def test_the_swapped_gemm_builds_for_a_dynamic_m(tmp_path: Path, split_k: int) -> None:
    # a fresh interpreter, as the build's worker: this process may hold the no-JIT guard of an earlier test's load
    proc = subprocess.run([sys.executable, "-c", _DYNAMIC_M, str(split_k)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    src = proc.stdout
    assert "wgmma" in src  # N on the MMA's 64-row side: one warpgroup's wgmma, not the mma.sync fallback
    assert ("atomicAdd" in src or "AtomicAdd" in src) == (split_k > 1)


def test_a_swapped_candidate_builds_through_the_release_build(tmp_path: Path) -> None:
    from tileship.build.builder import compile_one
    from tileship.runtime import artifact, signature

    spec = next(s for s in expand(gemm_tuned.gemm_tuned) if s.candidate in SWAPS and s.dynamic_dim == "M"
                and s.dim_map()["K"] == 11008 and s.dtype == "float16")
    d = tmp_path / spec.id
    r = compile_one(gemm_tuned.gemm_tuned, spec, d, timeout_s=300)
    assert r.ok, r.error
    art = json.loads((d / "artifact.json").read_text())
    sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
    assert [p.name for p in sig.params] == ["A", "B", "C"] and art["out_idx"] == [2]
    artifact.ffi_abi(d, art, sig, spec.id)  # the load-time ABI check passes on what was built
