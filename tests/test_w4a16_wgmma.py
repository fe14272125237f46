"""The W4A16 warpgroup-MMA kernel (``catalog/w4a16_wgmma.py``): its tiling checks, a NumPy replay of its index
arithmetic (each lane's A fragments, the shared slot ``ts_wg_x_copy`` fills copy by copy, the output fragment's
rows and columns) multiplied the way ``wgmma.mma_async`` reads them as PTX and CUTLASS describe it, and an nvcc
build for sm_90a. Whether the hardware reads the descriptor this way, and how fast it is, is for the GPU:
``benchmarks/dev/wg_probe.py`` and ``w4a16_sweep.py`` (kind ``wg``)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tilelang")

from tileship.catalog.w4a16_wgmma import check_wg, offsets, w4a16_gemm_wg, wg_struct  # noqa: E402


def slot_bytes(x: np.ndarray, M: int, NP: int, G: int, lbo: int, sbo: int, sb: int) -> np.ndarray:
    """The slot as ``ts_wg_x_copy`` fills it, copy by copy: values indexed by byte offset / 2 (one per fp16);
    also checks that the 32 lanes of each copy instruction write 32 distinct banks where the layout says so."""
    slot = np.full(4 * sb, np.nan)
    banks: dict[tuple[int, int, int], set[int]] = {}
    for t in range(128):
        q, lane = t >> 5, t & 31
        l, s1, w0, c = lane & 1, (lane >> 1) & 1, (lane >> 2) & 1, lane >> 3
        for w1 in range(2):
            P = 16 * c + 8 * w1 + 4 * w0 + 2 * s1 + l
            d0 = (4 * w1 + 2 * w0 + s1) * sb + l * lbo + 4 * c
            for r in range(NP // 4):
                n = q + 4 * r
                dst = d0 + (n >> 3) * sbo + (n & 7) * 16
                banks.setdefault((q, w1, r), set()).add(dst // 4 % 32)
                pair = x[n, G * 128 + 2 * P: G * 128 + 2 * P + 2] if n < M else np.zeros(2)
                assert np.isnan(slot[dst // 2: dst // 2 + 2]).all(), "two copies write the same bytes"
                slot[dst // 2: dst // 2 + 2] = pair
    written = np.zeros(len(slot), bool)
    for s in range(8):  # the bytes wgmma reads: k-step s, rows < NP, both core matrices along K
        for n in range(NP):
            for h in range(2):
                at = (s * sb + (n >> 3) * sbo + (n & 7) * 16 + h * lbo) // 2
                written[at: at + 8] = True
    assert not np.isnan(slot[written]).any(), "bytes wgmma reads that no copy writes"
    slot_bytes.banks = banks  # type: ignore[attr-defined]
    return slot


def a_fragment(W: np.ndarray, warp: int, g: int, c: int, G: int, s: int) -> np.ndarray:
    """The lane's 4 registers (8 values) of k-step s: word wi = s // 2, pairs 0-1 (s even) or 2-3 (s odd)."""
    wi, half = s // 2, s % 2
    base = G * 128 + 32 * c + 8 * wi
    out = []
    for p in (2 * half, 2 * half + 1):
        for row in (16 * warp + g, 16 * warp + g + 8):
            out.append(W[row, base + 2 * p: base + 2 * p + 2])
    # registers in the order the kernel builds them: {e0[p0], e1[p0], e0[p1], e1[p1]}
    return np.concatenate(out)


def replay(M: int, groups: int, layout: int, rng: np.random.Generator) -> float:
    NP = 8 * -(-M // 8)
    lbo, sbo, sb = offsets(layout, NP)
    K = 128 * groups
    x = rng.standard_normal((M, K))
    W = rng.standard_normal((64, K))
    D = np.zeros((64, NP))
    for G in range(groups):
        slot = slot_bytes(x, M, NP, G, lbo, sbo, sb)
        for s in range(8):
            start = s * sb
            Bm = np.zeros((16, NP))
            for kk in range(16):
                for n in range(NP):
                    off = start + (n % 8) * 16 + (n // 8) * sbo + (kk % 8) * 2 + (kk // 8) * lbo
                    Bm[kk, n] = slot[off // 2]
            Am = np.zeros((64, 16))
            for warp in range(4):
                for lane in range(32):
                    g, c = lane >> 2, lane & 3
                    v = a_fragment(W, warp, g, c, G, s)
                    r0, r1 = 16 * warp + g, 16 * warp + g + 8
                    Am[r0, 2 * c: 2 * c + 2] = v[0:2]
                    Am[r1, 2 * c: 2 * c + 2] = v[2:4]
                    Am[r0, 2 * c + 8: 2 * c + 10] = v[4:6]
                    Am[r1, 2 * c + 8: 2 * c + 10] = v[6:8]
            D += Am @ Bm
    C = np.zeros((M, 64))
    for warp in range(4):
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            for i in range(NP // 2):
                row = 16 * warp + g + 8 * ((i & 3) >> 1)
                col = 8 * (i >> 2) + 2 * c + (i & 1)
                if col < M:
                    C[col, row] = D[row, col]
    ref = x @ W.T
    return float(np.abs(C - ref).max() / np.abs(ref).max())



@pytest.mark.parametrize("M", [1, 5, 8, 16, 24, 32])
@pytest.mark.parametrize("layout", [0, 1, 2])
def test_the_replayed_kernel_computes_x_times_w_transposed(M: int, layout: int) -> None:
    assert replay(M, 3, layout, np.random.default_rng(M)) < 1e-12


@pytest.mark.parametrize("NP", [8, 16, 24, 32])
def test_the_padded_layout_gives_each_copy_instruction_32_banks(NP: int) -> None:
    """Layout 2's point (round 33: layouts 0 and 1 ran at half the catalog's speed): every cp.async of a warp
    writes 32 distinct banks; layout 0 at NP = 32 does not (8 lanes a bank), so the check can fail."""
    slot_bytes(np.zeros((NP, 128)), NP, NP, 0, *offsets(2, NP))
    assert all(len(b) == 32 for b in slot_bytes.banks.values())  # type: ignore[attr-defined]
    slot_bytes(np.zeros((32, 128)), 32, 32, 0, *offsets(0, 32))
    assert max(32 // len(b) for b in slot_bytes.banks.values()) == 8  # type: ignore[attr-defined]


def test_a_slot_written_twice_or_left_unwritten_is_caught_by_the_replay() -> None:
    """The replay's own check can fail: with the 8-row blocks' stride too small, copies collide."""
    with pytest.raises(AssertionError, match="same bytes"):
        slot_bytes(np.zeros((32, 128)), 32, 32, 0, 128, 64, 1024)


def test_tilings_that_do_not_fit_are_refused_naming_the_numbers() -> None:
    with pytest.raises(ValueError, match="divisible by ks \\* wk \\* unroll = 24"):
        check_wg(32, 4096, 4096, wk=1, ks=8, unroll=3)
    with pytest.raises(ValueError, match="N % 64 == 0"):
        check_wg(32, 4000, 4096, wk=1, ks=4, unroll=1)
    with pytest.raises(ValueError, match="ks=16 is not a portable cluster size"):
        check_wg(32, 4096, 4096, wk=1, ks=16, unroll=1)
    with pytest.raises(ValueError, match="1 to 32 rows, not M=33"):
        check_wg(33, 4096, 4096, wk=1, ks=4, unroll=1)
    with pytest.raises(ValueError, match="x_depth is 2, 3 or 4"):
        w4a16_gemm_wg(32, 4096, 4096, x_depth=1)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        w4a16_gemm_wg(32, 4096, 4096, "float32")


def test_the_wgmma_instruction_names_its_shape_types_and_operands() -> None:
    text = wg_struct(24, True, 0)
    assert "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16" in text
    assert "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, p, 1, 1, 0" in text
    assert text.count('"+f"(d[') == 12


@pytest.mark.parametrize("dtype,ks,wk,xd", [("float16", 4, 1, 2), ("bfloat16", 1, 2, 3)])
def test_it_compiles_with_nvcc_for_sm90a(dtype: str, ks: int, wk: int, xd: int) -> None:
    """In a process of its own: a release loaded by another test forbids compiling in this one (no-JIT)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    code = (
        "import tilelang\n"
        "from tileship.catalog.w4a16_wgmma import w4a16_gemm_wg\n"
        f"k = tilelang.compile(w4a16_gemm_wg(32, 512, 2048, {dtype!r}, wk={wk}, ks={ks}, x_depth={xd}), "
        "out_idx=[3], target={'kind': 'cuda', 'arch': 'sm_90a'})\n"
        "print(k.get_kernel_source())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "wgmma.mma_async.sync.aligned.m64n32k16" in out.stdout
