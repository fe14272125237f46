"""The W4A16 MMA-GEMV with K split across a cluster's CTAs (``catalog/w4a16_mma_split.py``): its tiling checks,
a replay of how the CTAs and warps divide the work and where each partial sum goes, and an nvcc build for sm_90a.
Whether it is right and fast on the device is for ``benchmarks/dev/w4a16_sweep.py`` (kind ``mvc``) on the GPU."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("tilelang")

from tileship.catalog.w4a16_mma_split import check_split, w4a16_gemm_mv_split  # noqa: E402


def test_tilings_that_do_not_fit_are_refused_naming_the_numbers() -> None:
    with pytest.raises(ValueError, match="divisible by ks \\* wk \\* unroll = 24"):
        check_split(32, 4096, 4096, rt=2, wn=4, wk=1, ks=8, unroll=3)
    with pytest.raises(ValueError, match="N % 128 == 0"):
        check_split(32, 4000, 4096, rt=2, wn=4, wk=1, ks=4, unroll=1)
    with pytest.raises(ValueError, match="ks=16 is not a portable cluster size"):
        check_split(32, 4096, 4096, rt=2, wn=4, wk=1, ks=16, unroll=1)
    with pytest.raises(ValueError, match="1 to 32 rows, not M=33"):
        check_split(33, 4096, 4096, rt=2, wn=4, wk=1, ks=4, unroll=1)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        w4a16_gemm_mv_split(32, 4096, 4096, "float32")


@pytest.mark.parametrize("M,N,K,rt,wn,wk,ks,unroll", [
    (32, 4096, 14336, 2, 4, 1, 4, 1), (32, 4096, 14336, 4, 2, 2, 8, 1), (13, 28672, 4096, 4, 1, 2, 2, 2),
    (8, 512, 2048, 2, 2, 2, 4, 2)])
def test_the_ctas_and_warps_cover_every_row_and_group_once_and_the_partials_never_collide(
        M: int, N: int, K: int, rt: int, wn: int, wk: int, ks: int, unroll: int) -> None:
    """The index arithmetic of ``SPLIT_SRC``, replayed: warp (wn, wk) of CTA (kz, bx) owns rows
    [(bx WN + wn) 16 RT, +16 RT) and groups [(kz WK + wk) GPW, +GPW); CTA kz > 0's warp wk == 0 writes its
    PER x 32 sums at (kz - 1) stride + slot + e * 32 + lane, which CTA 0 reads back for the same (bx, wn)."""
    gpw = check_split(M, N, K, rt, wn, wk, ks, unroll)
    blocks, per = N // (16 * rt * wn), rt * -(-M // 8) * 4
    stride = blocks * wn * per * 32
    covered: dict[tuple[int, int], int] = {}
    written: dict[int, tuple[int, int, int]] = {}
    for kz, bx, w_n, w_k in itertools.product(range(ks), range(blocks), range(wn), range(wk)):
        row0, grp0 = (bx * wn + w_n) * 16 * rt, (kz * wk + w_k) * gpw
        for r in range(row0, row0 + 16 * rt, 8):  # rows in steps of 8 (a lane's g and g + 8): enough to tile
            for grp in range(grp0, grp0 + gpw):
                covered[(r, grp)] = covered.get((r, grp), 0) + 1
        if kz > 0 and w_k == 0:
            slot = (bx * wn + w_n) * per * 32
            for e, lane in itertools.product(range(per), range(32)):
                at = (kz - 1) * stride + slot + e * 32 + lane
                assert at not in written, (kz, bx, w_n, e, lane, written[at])
                written[at] = (kz, bx, w_n)
    assert set(covered.values()) == {1}
    assert len(covered) == (N // 8) * (K // 128)
    assert not written or max(written) < max(1, (ks - 1) * blocks * wn * per * 32)  # the workspace's length
    # CTA 0 reads, for its (bx, wn), exactly what ranks 1..ks-1 wrote for the same rows
    for bx, w_n in itertools.product(range(blocks), range(wn)):
        slot = (bx * wn + w_n) * per * 32
        for k, e, lane in itertools.product(range(1, ks), (0, per - 1), (0, 31)):
            assert written[(k - 1) * stride + slot + e * 32 + lane] == (k, bx, w_n)


@pytest.mark.parametrize("dtype,ks,wk", [("float16", 4, 1), ("bfloat16", 2, 2)])
def test_it_compiles_with_nvcc_for_sm90a_as_one_cluster_launch(dtype: str, ks: int, wk: int) -> None:
    """In a process of its own: a release loaded by another test forbids compiling in this one (no-JIT)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    code = (
        "import tilelang\n"
        "from tileship.catalog.w4a16_mma_split import w4a16_gemm_mv_split\n"
        f"k = tilelang.compile(w4a16_gemm_mv_split(32, 512, 2048, {dtype!r}, rt=2, wn=2, wk={wk}, ks={ks}), "
        "out_idx=[3], target={'kind': 'cuda', 'arch': 'sm_90a'})\n"
        "print(k.get_kernel_source())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ts_w4_mma_split<" in out.stdout and "barrier.cluster.arrive.release" in out.stdout
