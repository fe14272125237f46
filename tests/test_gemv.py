"""The fp16/bf16 decode ``linear`` (catalog/gemv.py): its declaration, its block plan for every
declared shape, its sample's scale, and a real nvcc build of the CUDA kernel on this machine (no
GPU: whether it is correct and faster than cuBLAS is decided by `tileship verify` on the H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tileship.catalog import gemv
from tileship.declare.spec import expand


def test_the_declaration_covers_every_llama_projection_at_decode_batches() -> None:
    specs = [s for s in expand(gemv.linear) if s.candidate == "default"]  # the MMA tilings: test_linear_mma
    assert len(specs) == len(gemv.LLAMA3_8B) * len(gemv.DECODE_M) * 2
    assert {s.target for s in specs} == {"cuda-sm90a"} and {s.dtype for s in specs} == {"float16", "bfloat16"}
    assert gemv.linear.inputs[1].dims == ("N", "K")  # F.linear's weight layout, used as it is


@pytest.mark.parametrize("m", [m for m in gemv.DECODE_M if m <= gemv.GEMV_MAX_M])
def test_the_plan_divides_every_declared_shape(m: int) -> None:
    for _, n, k in gemv.LLAMA3_8B:
        rows, threads = gemv.plan(m, n, k)
        assert n % rows == 0 and k % (threads * gemv.VEC) == 0, (m, n, k, rows, threads)
        loads = rows * k // (threads * gemv.VEC)  # 16-byte weight loads in flight per thread
        assert 1 <= loads <= 16, (m, n, k, loads)
        assert rows == 1 and threads == (256 if k > 8192 else 128)


@pytest.mark.parametrize("m", [m for m in gemv.DECODE_M if m > gemv.GEMV_MAX_M])
def test_every_declared_batch_past_the_gemv_gets_a_swapped_tile_that_fits(m: int) -> None:
    pytest.importorskip("tilelang")
    from tileship.catalog import gemm_small_m

    for _, n, k in gemv.LLAMA3_8B:
        block_m, (block_n, block_k, stages) = gemv.swap_tile(m, n, k)
        assert block_m == (8 if m <= 8 else 16) and block_m >= m
        gemm_small_m.check(n, k, block_m, block_n, block_k, stages, 1)  # raises for a tile that cannot cover


def test_a_swapped_tile_shrinks_to_fit_an_undeclared_shape() -> None:
    pytest.importorskip("tilelang")
    from tileship.catalog import gemm_small_m

    block_m, (block_n, block_k, stages) = gemv.swap_tile(64, 4096, 4224)  # 4224 = 33 x 128, not x 256
    assert (block_m, block_k) == (64, 128)
    gemm_small_m.check(4096, 4224, block_m, block_n, block_k, stages, 1)


def test_a_shape_the_plan_cannot_divide_is_refused() -> None:
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="linear_gemv needs K % 256 == 0"):
        gemv.linear_gemv(1, 64, 100)


def test_the_sample_gives_outputs_of_order_one() -> None:
    x, w = gemv.linear_sample({"M": 4, "N": 256, "K": 4096}, "float32", "cpu")
    y = gemv.linear_reference(x, w)
    assert y.shape == (4, 256) and 0.7 < float(y.std()) < 1.4
    assert torch.allclose(y, x @ w.t(), atol=1e-4)


def _built(tmp_path: Path, dtype: str, m: int, k: int) -> tuple[Path, str]:
    """Build the declared ``linear`` specialization (dtype, M, K) with nvcc as the release build does, check
    its calling convention and the load-time ABI check; (its directory, its CUDA source)."""
    from tileship.build.builder import compile_one
    from tileship.runtime import artifact, signature

    spec = next(s for s in expand(gemv.linear) if s.dtype == dtype and s.dim_map()["M"] == m and s.dim_map()["K"] == k)
    d = tmp_path / spec.id
    r = compile_one(gemv.linear, spec, d, timeout_s=300)
    assert r.ok, r.error
    art = json.loads((d / "artifact.json").read_text())
    sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
    assert [p.name for p in sig.params] == ["X", "W", "Y"] and art["out_idx"] == [2]
    artifact.ffi_abi(d, art, sig, spec.id)  # the load-time ABI check passes on what was built
    return d, (d / "device_kernel.cu").read_text()


def test_the_cuda_kernel_builds_with_16_byte_streamed_weights(tmp_path: Path) -> None:
    for dtype, m in (("float16", 1), ("bfloat16", 2)):
        d, src = _built(tmp_path, dtype, m, 14336)
        assert "*(uint4*)(w_reg + " in src and "*(uint4*)(W + " in src, "the weight loads are not 16-byte vectorized"
        assert "__shfl_down_sync" in src, "the block sum is not a warp-shuffle all-reduce"
        assert (d / "kernel.cubin").stat().st_size > 0


def test_past_the_gemv_the_swapped_tensor_core_kernel_builds_reading_the_weight_as_stored(tmp_path: Path) -> None:
    for dtype, m, k in (("float16", 8, 4096), ("bfloat16", 16, 14336)):
        _, src = _built(tmp_path, dtype, m, k)
        # the weight on the MMA's 64-row side, the batch on its narrow side (8 or 16), both tiles by TMA
        assert "wgmma_ss<" in src and f", 64, {8 if m <= 8 else 16}, 16," in src, "not a swapped wgmma"
        assert "tma_load(W_desc" in src and "tma_load(X_desc" in src
