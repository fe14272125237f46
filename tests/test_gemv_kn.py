"""The GEMV-style candidate of the tuned GEMM (catalog/gemv_kn.py): its shape checks, its place
among ``gemm_tuned``'s candidates, and a real nvcc build with a dynamic M on this machine (no
GPU: whether it is correct and faster than cuBLAS is decided by ``tileship tune`` on the H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tilelang")

from tileship.catalog import gemm_tuned, gemv_kn  # noqa: E402
from tileship.declare.spec import expand  # noqa: E402

GEMV = "block_N64-threads1024-gemv_rows1-unroll8"


@pytest.mark.parametrize(("n", "k", "cfg", "words"), [
    (4096, 4096, (48, 256, 1, 8), "block_N=48"),  # 6 lanes do not divide a warp
    (4100, 4096, (64, 256, 1, 8), "N % block_N"),
    (4096, 4096, (64, 100, 1, 8), "whole warps"),
    (4096, 4096, (64, 256, 0, 8), "m_rows=0"),
])
def test_a_block_that_cannot_cover_the_shape_is_refused(n, k, cfg, words) -> None:
    with pytest.raises(ValueError, match=words):
        gemv_kn.check(n, k, *cfg)


def test_k_groups_follow_the_lanes_and_any_k_is_covered() -> None:
    assert gemv_kn.check(4096, 4096, 64, 1024, 1, 8) == 128  # 8 lanes of 16 bytes, 128 K groups
    assert gemv_kn.check(4096, 11008, 32, 512, 2, 16) == 128  # 11008 is not a multiple of 128 x 16: a tail


def test_the_tuned_gemm_declares_the_gemv_candidate_for_every_shape() -> None:
    specs = expand(gemm_tuned.gemm_tuned)
    gemv = [s for s in specs if s.candidate == GEMV]
    assert gemv and len(gemv) == len(specs) // 8  # one of eight candidates, at every shape and range
    assert dict(gemv[0].config)["gemv_rows"] == 1


def test_the_gemv_candidate_builds_for_a_dynamic_m(tmp_path: Path) -> None:
    from tileship.build.builder import compile_one
    from tileship.runtime import artifact, signature

    spec = next(s for s in expand(gemm_tuned.gemm_tuned) if s.candidate == GEMV and s.dynamic_dim == "M"
                and s.dim_map()["K"] == 11008 and s.dtype == "bfloat16")
    d = tmp_path / spec.id
    r = compile_one(gemm_tuned.gemm_tuned, spec, d, timeout_s=300)
    assert r.ok, r.error
    art = json.loads((d / "artifact.json").read_text())
    sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
    assert [p.name for p in sig.params] == ["A", "B", "C"] and art["out_idx"] == [2]
    artifact.ffi_abi(d, art, sig, spec.id)  # the load-time ABI check passes on what was built
    src = (d / "device_kernel.cu").read_text()
    assert "__shfl_xor_sync" in src and "uint4" in src  # 16-byte loads; the K groups of a warp add up by shuffles
