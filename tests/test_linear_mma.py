"""The 16-bit MMA-GEMV (``catalog.linear_mma``) on this machine without a GPU: the CUDA code's register plan,
replayed lane by lane through the PTX fragment layouts of ``mma.m16n8k16``, gives ``x @ W^T``; which tilings
``linear`` declares for which shapes; its shape rules; and it compiles with nvcc for sm_90a. Whether the
device runs it right, and faster than cuBLAS, is not shown here: ``tileship tune`` on the target GPU
decides that per shape, and an untuned release serves ``linear_decode``'s kernel."""

from __future__ import annotations

import pytest
import torch

from tileship.catalog import gemv
from tileship.catalog.linear_mma import LINEAR_MV_CANDIDATES, MV_M, linear_mv, mv_applies
from tileship.declare.spec import expand

F64 = torch.float64


def _vec(t: torch.Tensor, row: int, start: int) -> list[list[float]]:
    """One 16-byte load of eight halves from ``start`` of ``row``, as its four 32-bit registers x, y, z, w
    (each a pair of halves, the lower address first)."""
    v = t[row, start: start + 8].tolist()
    return [v[0:2], v[2:4], v[4:6], v[6:8]]


def _replay(x: torch.Tensor, w: torch.Tensor, rt: int, wn: int, wk: int) -> torch.Tensor:
    """y as ``ts_h_mma_block`` computes it: per block, warp, group and lane, the registers the CUDA code loads
    (four 16-byte vectors of rows g and g + 8, halves 32c .. 32c + 31 of the group; the same of x's row
    8n + g), composed into ``lo``/``hi`` and ``b0``/``b1`` as the code composes them, scattered into the
    16x16 and 16x8 operands by the PTX layouts, multiplied, gathered back from the C fragments and summed
    over the warps along K."""
    M, K = x.shape
    N = w.shape[0]
    groups = K // 128
    gpw = groups // wk
    nt = -(-M // 8)
    y = torch.zeros(M, N, dtype=F64)
    for bx in range(N // (16 * rt * wn)):
        for wn_i in range(wn):
            row0 = (bx * wn + wn_i) * 16 * rt
            for wk_i in range(wk):
                for grp in range(wk_i * gpw, (wk_i + 1) * gpw):
                    for t in range(rt):
                        for n in range(nt):
                            for wi in range(4):
                                for half in range(2):  # lo: registers x, y; hi: z, w
                                    a = torch.zeros(16, 16, dtype=F64)
                                    b = torch.zeros(16, 8, dtype=F64)
                                    for lane in range(32):
                                        g, c = lane // 4, lane % 4
                                        base = grp * 128 + 32 * c + 8 * wi
                                        e = [_vec(w, row0 + 16 * t + g + 8 * h, base) for h in range(2)]
                                        regs = [e[0][2 * half], e[1][2 * half], e[0][2 * half + 1], e[1][2 * half + 1]]
                                        for r, pair in enumerate(regs):  # a_r: row g + 8 (r % 2), k 2c + 8 (r // 2)
                                            a[g + 8 * (r % 2), 2 * c + 8 * (r // 2): 2 * c + 8 * (r // 2) + 2] = (
                                                torch.tensor(pair, dtype=F64))
                                        if 8 * n + g < M:  # b0, b1: k 2c and 2c + 8 of column g
                                            xv = _vec(x, 8 * n + g, base)
                                            b[2 * c: 2 * c + 2, g] = torch.tensor(xv[2 * half], dtype=F64)
                                            b[2 * c + 8: 2 * c + 10, g] = torch.tensor(xv[2 * half + 1], dtype=F64)
                                    d = a @ b  # the MMA
                                    for lane in range(32):
                                        g, c = lane // 4, lane % 4
                                        for i in range(4):
                                            col = 8 * n + 2 * c + (i & 1)
                                            if col < M:
                                                y[col, row0 + 16 * t + g + 8 * (i >> 1)] += d[g + 8 * (i >> 1),
                                                                                               2 * c + (i & 1)]
    return y


@pytest.mark.parametrize("M,rt,wn,wk", [(1, 1, 1, 2), (5, 2, 1, 4), (8, 1, 2, 2), (13, 1, 1, 1), (16, 2, 2, 2)])
def test_the_register_plan_computes_x_times_w_transposed(M: int, rt: int, wn: int, wk: int) -> None:
    torch.manual_seed(M)
    N, K = 64, 512
    w = torch.randn(N, K, dtype=F64)
    x = torch.randn(M, K, dtype=F64)
    got = _replay(x, w, rt, wn, wk)
    want = x @ w.t()
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (got - want).abs().max()


def test_a_wrong_register_order_is_caught_by_the_replay() -> None:
    """The replay can fail: with x's halves taken one vector later the sum is wrong."""
    torch.manual_seed(0)
    w = torch.randn(16, 256, dtype=F64)
    x = torch.randn(8, 256, dtype=F64)
    shifted = torch.roll(x, shifts=8, dims=1)
    assert not torch.allclose(_replay(shifted, w, 1, 1, 1), x @ w.t(), rtol=1e-6, atol=1e-6)


def test_linear_declares_the_mma_tilings_only_where_they_apply() -> None:
    specs = expand(gemv.linear)
    default = [s for s in specs if s.candidate == "default"]
    assert len(default) == len(gemv.LLAMA3_8B) * len(gemv.DECODE_M) * 2  # the kernel of before, everywhere
    mv = [s for s in specs if s.candidate != "default"]
    assert mv and all(MV_M[0] <= s.dim_map()["M"] <= MV_M[1] for s in mv)
    for s in mv:
        cfg = dict(s.config)
        linear_mv_args = dict(rt=cfg["mv_rt"], wk=cfg["mv_wk"], unroll=cfg["mv_unroll"])
        dims = s.dim_map()
        # every built tiling divides its shape: the factory does not raise
        pytest.importorskip("tilelang")
        linear_mv(int(dims["M"]), int(dims["N"]), int(dims["K"]), s.dtype, **linear_mv_args)
    by_shape: dict[tuple[int, int, int], set[str]] = {}
    for s in mv:
        d = s.dim_map()
        by_shape.setdefault((int(d["M"]), int(d["N"]), int(d["K"])), set()).add(s.candidate)
    # each projection at each of M = 4, 8, 16 has at least two tilings to choose from
    assert len(by_shape) == len(gemv.LLAMA3_8B) * 3 and min(len(v) for v in by_shape.values()) >= 2


def test_the_applies_rule_refuses_batches_tilings_and_launches_it_does_not_serve() -> None:
    first = LINEAR_MV_CANDIDATES[0]
    assert mv_applies({}, {"M": 1, "N": 4096, "K": 4096})  # linear_decode's kernel: always
    assert mv_applies(first, {"M": 8, "N": 4096, "K": 4096})
    assert not mv_applies(first, {"M": 2, "N": 4096, "K": 4096})  # below MV_M: the GEMV's
    assert not mv_applies(first, {"M": 32, "N": 4096, "K": 4096})
    assert not mv_applies(first, {"M": (1, 64), "N": 4096, "K": 4096})  # a dynamic range
    assert not mv_applies(first, {"M": 8, "N": 4096, "K": 4096 + 128})  # 33 groups do not split 8 ways
    assert not mv_applies(first, {"M": 8, "N": 512, "K": 4096})  # 32 blocks: too few for the SMs
    assert not mv_applies(first, {"M": 8, "N": 4096, "K": 14336})  # 14 groups a warp: past MV_MAX_GROUPS


def test_shapes_the_tiling_does_not_cover_are_refused_by_name() -> None:
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="linear_mv needs K % 128 == 0, N % 32 == 0"):
        linear_mv(8, 4008, 4096, rt=2)
    with pytest.raises(ValueError, match="linear_mv serves decode batches of 1 to 32 rows"):
        linear_mv(64, 4096, 4096)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        linear_mv(8, 4096, 4096, "float32")


@pytest.mark.parametrize("dtype,M,rt,unroll", [("float16", 8, 1, 2), ("bfloat16", 16, 2, 1)])
def test_it_compiles_with_nvcc_for_sm90a(dtype: str, M: int, rt: int, unroll: int) -> None:
    """In a process of its own: a release loaded by another test forbids compiling in this one (no-JIT)."""
    import shutil
    import subprocess
    import sys

    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    code = (
        "import tilelang\n"
        "from tileship.catalog.gemv import linear_decode\n"
        f"k = tilelang.compile(linear_decode({M}, 512, 1024, {dtype!r}, mv_rt={rt}, mv_wk=2, mv_unroll={unroll}), "
        "out_idx=[2], target={'kind': 'cuda', 'arch': 'sm_90a'})\n"
        "print(k.get_kernel_source())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ts_h_mma_block<" in out.stdout and "ts_mma_reduce_store<" in out.stdout
    assert "mma.sync.aligned.m16n8k16" in out.stdout
