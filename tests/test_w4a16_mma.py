"""The W4A16 MMA-GEMV (``catalog.w4a16_mma``) on this machine without a GPU: the kernel's index plan,
replayed lane by lane through the PTX fragment layouts of ``mma.m16n8k16``, gives ``x @ dequantize(W)^T``;
its shape rules; and it compiles with nvcc for sm_90a. Whether the device runs it right is the GPU
sweep's (``benchmarks/dev/w4a16_sweep.py --kinds mv``: every variant's error against float32)."""

from __future__ import annotations

import pytest
import torch

from tileship.catalog.w4a16 import dequantize, quantize
from tileship.catalog.w4a16_mma import check, mma_order, w4a16_gemm_mv

F64 = torch.float64


def _decode_word(word: int) -> list[int]:
    """The 8 values (q - 8) of one packed word, in element order (``w4a16_device``'s interleave)."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    out = [0] * 8
    for j in range(8):
        out[order[j]] = ((word >> (4 * j)) & 0xF) - 8
    return out


def _replay(x: torch.Tensor, qw: torch.Tensor, sc: torch.Tensor, rt: int, wn: int, wk: int) -> torch.Tensor:
    """y as the kernel computes it: per block, warp and lane, the A and B fragments the CUDA code builds
    (words 4c..4c+3 of rows g and g+8, x[n, 32c .. 32c+31] of the group), scattered into the logical
    16x16 and 16x8 operands by the PTX layouts, multiplied, gathered back from the C fragments."""
    M, K = x.shape
    N = qw.shape[0]
    gpw = check(M, N, K, rt, wn, wk, 1)
    nt = -(-M // 8)
    words = qw.to(torch.int64) & 0xFFFFFFFF
    y = torch.zeros(M, N, dtype=torch.float64)
    for bx in range(N // (16 * rt * wn)):
        for wn_i in range(wn):
            row0 = (bx * wn + wn_i) * 16 * rt
            for wk_i in range(wk):
                for grp in range(wk_i * gpw, (wk_i + 1) * gpw):
                    for t in range(rt):
                        for n in range(nt):
                            for s in range(8):
                                a = torch.zeros(16, 16, dtype=torch.float64)
                                b = torch.zeros(16, 8, dtype=torch.float64)
                                for lane in range(32):
                                    g, c = lane // 4, lane % 4
                                    wi, half = s // 2, s % 2
                                    for h in range(2):  # rows g and g + 8
                                        row = row0 + 16 * t + g + 8 * h
                                        vals = _decode_word(int(words[row, grp * 16 + 4 * c + wi]))
                                        scale = float(sc[row, grp])
                                        pairs = [vals[2 * p: 2 * p + 2] for p in range(4)]
                                        lo, hi = pairs[2 * half], pairs[2 * half + 1]
                                        a[g + 8 * h, 2 * c: 2 * c + 2] = torch.tensor(lo, dtype=F64) * scale
                                        a[g + 8 * h, 2 * c + 8: 2 * c + 10] = torch.tensor(hi, dtype=F64) * scale
                                    col = 8 * n + g
                                    if col < M:
                                        phys = [grp * 128 + p for p in mma_order(c, s)]
                                        xs = x[col, phys].to(torch.float64)
                                        b[2 * c: 2 * c + 2, g] = xs[0:2]
                                        b[2 * c + 8: 2 * c + 10, g] = xs[2:4]
                                d = a @ b  # the MMA
                                for lane in range(32):
                                    g, c = lane // 4, lane % 4
                                    for i in range(4):
                                        row = row0 + 16 * t + g + 8 * (i >> 1)
                                        col = 8 * n + 2 * c + (i & 1)
                                        if col < M:
                                            y[col, row] += d[g + 8 * (i >> 1), 2 * c + (i & 1)]
    return y


@pytest.mark.parametrize("M", [1, 5, 8, 13])
def test_the_fragment_plan_computes_x_times_w_transposed(M: int) -> None:
    torch.manual_seed(M)
    N, K = 64, 256
    w = torch.randn(N, K, dtype=torch.float64) * 0.02  # float64 scales: the replay is exact
    qw, sc = quantize(w)
    x = torch.randn(M, K, dtype=torch.float64)
    want = x.double() @ dequantize(qw, sc).double().t()
    got = _replay(x, qw, sc, rt=1, wn=2, wk=2)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (got - want).abs().max()


def test_the_permutation_covers_each_group_once_and_lanes_read_contiguous_x() -> None:
    seen = sorted(p for c in range(4) for s in range(8) for p in mma_order(c, s))
    assert seen == list(range(128))
    for c in range(4):  # lane column c reads x[n, 32c .. 32c + 31]: four 16-byte loads a group
        assert sorted(p for s in range(8) for p in mma_order(c, s)) == list(range(32 * c, 32 * c + 32))


def test_shapes_the_tiling_does_not_cover_are_refused() -> None:
    with pytest.raises(ValueError, match="N % 64 == 0"):
        w4a16_gemm_mv(8, 4000, 4096, rt=2, wn=2)
    with pytest.raises(ValueError, match="wk \\* unroll = 12"):
        w4a16_gemm_mv(8, 4096, 4096, wk=4, unroll=3)
    with pytest.raises(ValueError, match="1 to 32 rows"):
        w4a16_gemm_mv(64, 4096, 4096)
    with pytest.raises(ValueError, match="128 row blocks do not split into tiles=3"):
        w4a16_gemm_mv(8, 4096, 4096, rt=1, wn=2, tiles=3)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        w4a16_gemm_mv(8, 4096, 4096, "float32")
    with pytest.raises(ValueError, match="l2_prefetch is 0, 128 or 256 bytes, not 64"):
        w4a16_gemm_mv(8, 4096, 4096, l2_prefetch=64)


@pytest.mark.parametrize("dtype,prefetch,tiles,l2", [("float16", True, 2, 0), ("bfloat16", False, 1, 0),
                                                     ("float16", False, 1, 256)])
def test_it_compiles_with_nvcc_for_sm90a(dtype: str, prefetch: bool, tiles: int, l2: int) -> None:
    """In a process of its own: a release loaded by another test forbids compiling in this one (no-JIT)."""
    import shutil
    import subprocess
    import sys

    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    code = (
        "import tilelang\n"
        "from tileship.catalog.w4a16_mma import w4a16_gemm_mv\n"
        f"k = tilelang.compile(w4a16_gemm_mv(8, 256, 1024, {dtype!r}, rt=1, wn=2, wk=2, unroll=2, "
        f"prefetch={prefetch}, tiles={tiles}, l2_prefetch={l2}), out_idx=[3], "
        "target={'kind': 'cuda', 'arch': 'sm_90a'})\n"
        "print(k.get_kernel_source())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ts_w4_mma_block<" in out.stdout and "mma.sync.aligned.m16n8k16" in out.stdout
    call = out.stdout[out.stdout.index("ts_w4_mma_block<", out.stdout.index("extern \"C\"")):]
    call = call[:call.index(">")]  # the kernel's instantiation: L2 = 256 named, 0 left to the default
    assert call.endswith(", 256") if l2 else call.endswith(f", {tiles}"), call


def test_mv_config_covers_the_llama_projections_and_falls_back_where_it_cannot() -> None:
    from tileship.catalog.w4a16 import LLAMA3_8B, w4a16_linear
    from tileship.catalog.w4a16_mma import mv_config

    for _, n, k in LLAMA3_8B:
        for m in (4, 8):
            cfg = mv_config(m, n, k)
            assert cfg is not None, (n, k)
            check(m, n, k, cfg["rt"], cfg["wn"], cfg["wk"], cfg["unroll"])  # raises if the tiling does not fit
    assert mv_config(8, 4096, 4096 + 128) is None  # 33 groups: no split of 8 warps x 4 groups
    assert "ts_w4_mma_block" not in str(w4a16_linear(8, 4096, 4096 + 128).script())  # the GEMM serves it
