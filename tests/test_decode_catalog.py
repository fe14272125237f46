"""The decode operators of the catalog: int4 packing, references, declarations, and the "c"-target
twins that run through build -> load -> call here (the CUDA kernels themselves run on the GPU host)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tileship
from tileship.catalog import add_rmsnorm, cpu_decode, gqa_decode, gqa_paged, w4a16
from tileship.declare.spec import expand


@pytest.mark.parametrize("n,k", [(64, 256), (32, 4096), (8, 14336)], ids=lambda v: str(v))
def test_quantize_round_trip(n: int, k: int) -> None:
    torch.manual_seed(0)
    weight = torch.randn(n, k) * 0.02
    qweight, scales = w4a16.quantize(weight)
    assert qweight.dtype == torch.int32 and qweight.shape == (n, k // 8)
    assert scales.shape == (n, k // 128) and scales.dtype == weight.dtype
    back = w4a16.dequantize(qweight, scales)
    # symmetric int4: every weight within half a quantization step of the original
    step = scales.float().repeat_interleave(128, dim=1)
    err = (back.float() - weight.float()).abs()
    assert bool((err <= step / 2 + 1e-7).all()), f"max error {float((err - step / 2).max()):.3g} over half a step"
    # packing is exact: quantizing the dequantized weight gives the same words
    assert torch.equal(w4a16.quantize(back)[0], qweight)


def test_packing_nibble_order() -> None:
    """Element e of each group of 8 sits in nibble PERM.index(e) (one LOP3 decodes a pair in order)."""
    weight = torch.zeros(1, 128)
    values = [-7.0, -5.0, -3.0, -1.0, 0.0, 2.0, 4.0, 7.0]  # absmax 7 -> scale 1, q = w + 8 exactly
    weight[0, :8] = torch.tensor(values)
    qweight, scales = w4a16.quantize(weight)
    assert float(scales[0, 0]) == 1.0
    word = int(qweight[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * w4a16.PERM.index(e))) & 0xF for e in range(8)] == [int(v) + 8 for v in values]
    assert w4a16.dequantize(qweight, scales)[0, :8].tolist() == values


def test_quantize_rejects_a_k_that_is_not_whole_groups() -> None:
    with pytest.raises(ValueError, match="not a multiple of the group size 128"):
        w4a16.quantize(torch.randn(4, 200))


def test_w4a16_reference_is_dequantize_then_matmul() -> None:
    torch.manual_seed(1)
    x, qweight, scales = w4a16.w4a16_sample({"M": 3, "N": 16, "K": 256}, "float32", "cpu")
    expected = x.double() @ w4a16.dequantize(qweight, scales.double()).t()
    assert torch.allclose(w4a16.w4a16_reference(x, qweight, scales).double(), expected, atol=1e-5)
    assert 0.05 < float(expected.std()) < 5, "the sample keeps outputs O(1) so the tolerances mean something"


def test_gqa_reference_ignores_positions_past_each_length() -> None:
    torch.manual_seed(2)
    q, k, v, _ = gqa_decode.gqa_decode_sample({"B": 2, "S": 32, "HQ": 4, "HKV": 2, "D": 8}, "float32", "cpu")
    lengths = torch.tensor([5, 32], dtype=torch.int32)
    out = gqa_decode.gqa_decode_reference(q, k, v, lengths)
    k2, v2 = k.clone(), v.clone()
    k2[0, 5:] = 1e3
    v2[0, 5:] = -1e3
    assert torch.allclose(gqa_decode.gqa_decode_reference(q, k2, v2, lengths), out)
    # the per-sequence slice computed directly
    manual = torch.nn.functional.scaled_dot_product_attention(
        q[0:1].unsqueeze(2), k[0:1, :5].transpose(1, 2), v[0:1, :5].transpose(1, 2), enable_gqa=True).squeeze(2)
    assert torch.allclose(out[0:1], manual, atol=1e-6)


@pytest.mark.parametrize("op", [w4a16.w4a16, gqa_decode.gqa, add_rmsnorm.add_rmsnorm, gqa_paged.gqa_paged],
                         ids=lambda o: o.name)
def test_cuda_declarations_expand(op) -> None:
    specs = expand(op)
    assert specs and all(s.target == "cuda-sm90a" for s in specs)
    assert {s.dtype for s in specs} == {"float16", "bfloat16"}


def test_w4a16_factory_picks_the_kernel_by_shape() -> None:
    pytest.importorskip("tilelang")
    import tilelang.language as T

    from tileship.catalog.w4a16_tc import w4a16_gemm_rs as w4a16_gemm_rs_

    src = {m: str(w4a16.w4a16_linear(m, 4096, 14336).script()) for m in (1, 2, 4, 8, 16)}
    assert "ts_w4_gemv3_steps" in src[1] and "T.gemm" not in src[1]
    assert "ts_w4_gemv3_steps<__half2, __half, 2, 4, 7, 4>" in src[2]  # K-split GEMV, 2 warps of 7 steps
    # M=4 and 8: the MMA-GEMV (one row tile, 14 warps along K: 8 of the 112 groups each, 2 in flight); at
    # M=4 the B lanes past M hold zeros
    for m in (4, 8):
        assert f"ts_w4_mma_block<__half2, __half, false, 1, 1, {m}, 8, 2, 1, 14, false, false, 1>" in src[m]
        assert "T.gemm" not in src[m]
    # M=16: weights decoded into the MMA's registers by LOP3, K split 8 at N=4096 (14336 / 1024 steps)
    assert "T.gemm" in src[16] and "ts_w4_elem<__half2" in src[16] and "ts_w4_dq8" not in src[16]
    assert 'T.thread_binding(64, thread="blockIdx.x")' in src[16]
    assert 'T.thread_binding(8, thread="blockIdx.z")' in src[16]
    # its split-K sum: one output a thread, a loop over the splits; reduce="vector" (measured no faster in
    # round 29, not in the catalog): four outputs a thread, the loop over the other 7 splits unrolled
    assert "T.unroll(" not in src[16] and 'T.thread_binding(16, thread="blockIdx.x")' in src[16]
    vec_sum = str(w4a16_gemm_rs_(16, 4096, 14336, block_M=16, block_N=64, split_k=8, decode="lop3",
                                 reduce="vector").script())
    assert 'T.thread_binding(4, thread="blockIdx.x")' in vec_sum and "T.unroll(7)" in vec_sum
    with pytest.raises(ValueError, match="N % 1024 == 0"):
        w4a16_gemm_rs_(16, 4096 + 256, 14336, block_M=16, block_N=64, split_k=8, decode="lop3", reduce="vector")
    assert "ts_w4_mma_block<__nv_bfloat162, __nv_bfloat16, true, 2, 1, 8, 4, 4, 1, 8, false, false, 1>" in str(
        w4a16.w4a16_linear(8, 28672, 4096, "bfloat16").script())  # gate_up: two row tiles, 8 warps along K
    assert "ts_w4_elem<__nv_bfloat162" in str(w4a16.w4a16_linear(32, 6144, 4096, "bfloat16").script())
    from tileship.catalog.w4a16_tc import w4a16_gemm_rs

    pair = str(w4a16_gemm_rs(8, 4096, 14336, block_M=8, block_N=64, split_k=8, decode="pair").script())
    assert "ts_w4_pair<__half2" in pair and "ts_w4_elem<" not in pair  # one call per pair of weights
    with pytest.raises(ValueError, match="decode must be"):
        w4a16_gemm_rs(8, 4096, 14336, decode="int")
    # the round-12 knobs: the cluster reduce (one kernel, two cluster barriers), scales read in place
    # (no shared copy of them), the swizzled packed tile (its layout is XOR-permuted by row)
    cluster = str(w4a16_gemm_rs(8, 4096, 14336, block_M=8, block_N=64, split_k=8, decode="lop3",
                                reduce="cluster").script())
    assert "cluster_dims" in cluster and cluster.count("cluster_sync") == 2 and "alloc_global" not in cluster
    with pytest.raises(ValueError, match="split_k <= 8"):
        w4a16_gemm_rs(8, 4096, 14336, block_N=64, split_k=16, reduce="cluster")
    plain = str(w4a16_gemm_rs(8, 4096, 14336, block_M=8, block_N=64, split_k=8, decode="lop3").script())
    in_place = str(w4a16_gemm_rs(8, 4096, 14336, block_M=8, block_N=64, split_k=8, decode="lop3",
                                 scales="global").script())
    assert "T.copy(T.region(S[" in plain and "s_sh[i, k]" in plain  # a shared copy of the scales, then read
    assert "T.copy(T.region(S[" not in in_place and "S[bx * 64 + i, bz * 14 + k]" in in_place
    with pytest.raises(ValueError, match="scales must be"):
        w4a16_gemm_rs(8, 4096, 14336, decode="cast", scales="global")
    from tileship.catalog.w4a16_tc import _bq_swizzle

    banks = {(_bq_swizzle(g, 4)[0] * 16 + _bq_swizzle(g, 4)[1]) % 32 for g in range(8)}
    assert len(banks) == 8  # the 8 row groups of an MMA fragment read 8 distinct banks (unswizzled: 2)
    assert {_bq_swizzle(5, j)[1] // 4 for j in range(16)} == {0, 1, 2, 3}  # each row keeps its 4 chunks
    assert "ts_w4_dq8" in str(w4a16.w4a16_linear(128, 4096, 4096).script())  # M > 64: decoded through shared memory
    assert w4a16.w4a16.pass_configs == {"tl.disable_warp_specialized": True}
    assert "ts_w4_gemv3_steps<__nv_bfloat162, __nv_bfloat16, 1, 4, 2, 2>" in str(
        w4a16.w4a16_linear(1, 28672, 4096, "bfloat16").script())
    assert "ts_w4_dq8" in str(w4a16.w4a16_linear(T.dynamic("M"), 4096, 4096).script())


@pytest.fixture(scope="module")
def twins_release(tmp_path_factory):
    """The "c"-target twins built into a release of their own (real TileLang compiles)."""
    import dataclasses

    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import builtin_project, load_operators

    project = dataclasses.replace(builtin_project(), targets=("c",), operator_modules=("tileship.catalog.cpu_decode",))
    return build(project, load_operators(project), tmp_path_factory.mktemp("twins"), BuildOptions(jobs=2))


def test_cpu_twins_run_their_kernels(twins_release) -> None:
    assert not twins_release.failed
    release = tileship.load(twins_release.path)
    torch.manual_seed(3)
    weight = torch.randn(64, 256)
    qweight, scales = w4a16.quantize(weight)
    x = torch.randn(1, 256)
    y, decision = release.op("w4a16_cpu").call(x, qweight, scales)
    assert decision.path == "kernel", decision
    assert torch.allclose(y, w4a16.w4a16_reference(x, qweight, scales), atol=1e-4)
    # an int64 weight is not the declared int32: the reference serves it and says why
    _, decision = release.op("w4a16_cpu").call(x, qweight.long(), scales)
    assert (decision.path, decision.reason) == ("reference", "undeclared_dtype")

    q = torch.randn(2, 4, 16)
    k = torch.randn(2, 64, 2, 16)
    v = torch.randn(2, 64, 2, 16)
    k[0, 7:] = float("nan")  # the kernel never reads past a length
    v[0, 7:] = float("nan")
    lengths = torch.tensor([7, 64], dtype=torch.int32)
    o, decision = release.op("gqa_decode_cpu").call(q, k, v, lengths)
    assert decision.path == "kernel", decision
    assert not bool(torch.isnan(o).any())
    k[0, 7:] = 0.0
    v[0, 7:] = 0.0
    assert torch.allclose(o, gqa_decode.gqa_decode_reference(q, k, v, lengths), atol=1e-5)


def test_paged_twin_reads_only_the_pages_a_sequence_uses(twins_release) -> None:
    release = tileship.load(twins_release.path)
    torch.manual_seed(11)
    page, n_pages = gqa_paged.PAGE, 14
    q = torch.randn(3, 4, 16)
    k, v = torch.randn(n_pages, page, 2, 16), torch.randn(n_pages, page, 2, 16)
    lengths = torch.tensor([70, 256, 1], dtype=torch.int32)
    table = torch.tensor([[5, 9, -7, 99], [0, 1, 2, 3], [13, 1000, -1, 4]], dtype=torch.int32)  # junk past a length
    contiguous_k = gqa_paged.gather_pages(k, table, lengths)
    contiguous_v = gqa_paged.gather_pages(v, table, lengths)
    want = gqa_decode.gqa_decode_reference(q, contiguous_k, contiguous_v, lengths)
    used = {5, 9, 0, 1, 2, 3, 13}
    for p in set(range(n_pages)) - used:  # pages no sequence uses, and rows past a length, hold NaN
        k[p], v[p] = float("nan"), float("nan")
    k[9, 70 - page:], v[9, 70 - page:] = float("nan"), float("nan")
    o, decision = release.op("gqa_decode_paged_cpu").call(q, k, v, table, lengths)
    assert decision.path == "kernel", decision
    assert not bool(torch.isnan(o).any())
    assert torch.allclose(o, want, atol=1e-5)
    assert torch.allclose(gqa_paged.gqa_decode_paged_reference(q, k, v, table, lengths), want, atol=1e-6)


def test_paged_sample_poisons_unused_pages() -> None:
    dims = {"B": 3, "S": 256, "P": 14, "PAGE": 64, "HQ": 4, "HKV": 2, "D": 16}
    q, k, v, table, lengths = gqa_paged.gqa_decode_paged_sample(dims, "float32", "cpu")
    assert lengths.tolist() == [256, 256 - 96 - 5, 256]
    used = {int(p) for b in range(3) for p in table[b, : -(-int(lengths[b]) // 64)]}
    assert all(bool(torch.isnan(k[p]).all()) != (p in used) for p in range(14))
    assert not bool(torch.isnan(gqa_paged.gqa_decode_paged_reference(q, k, v, table, lengths)).any())


def test_add_rmsnorm_twin_returns_the_norm_and_the_new_residual(twins_release) -> None:
    release = tileship.load(twins_release.path)
    torch.manual_seed(5)
    x, r, w = torch.randn(8, 256), torch.randn(8, 256), torch.rand(256) + 0.5
    (y, h), decision = release.op("add_rmsnorm_cpu").call(x, r, w)
    assert decision.path == "kernel", decision
    assert torch.equal(h, x + r)
    assert torch.allclose(y, torch.nn.functional.rms_norm(x + r, (256,), w, add_rmsnorm.EPS), atol=1e-5)
    assert not torch.allclose(y, h)  # the two outputs are not swapped
    # an undeclared row count goes to the same reference, which returns both outputs as well
    (y3, h3), decision = release.op("add_rmsnorm_cpu").call(x[:3], r[:3], w)
    assert decision.path == "reference" and torch.equal(h3, x[:3] + r[:3]) and torch.allclose(y3, y[:3], atol=1e-5)


def test_cpu_twins_share_the_cuda_contract() -> None:
    assert cpu_decode.add_rmsnorm_cpu_op.reference is add_rmsnorm.add_rms_norm_reference
    assert [a.dims for a in cpu_decode.add_rmsnorm_cpu_op.outputs] == [a.dims for a in add_rmsnorm.add_rmsnorm.outputs]
    assert cpu_decode.w4a16_cpu_op.reference is w4a16.w4a16_reference
    assert [a.dtype for a in cpu_decode.w4a16_cpu_op.inputs] == [a.dtype for a in w4a16.w4a16.inputs]
    assert cpu_decode.gqa_decode_cpu_op.reference is gqa_decode.gqa_decode_reference
    assert [a.dims for a in cpu_decode.gqa_decode_cpu_op.inputs] == [a.dims for a in gqa_decode.gqa.inputs]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dequantize_in_the_scales_dtype_is_the_float32_product_rounded(dtype) -> None:
    """dequantize multiplies in the scales' dtype: q (-8..7) is exact there and one product is
    correctly rounded, so it must equal, bit for bit, the product taken in float32 and rounded."""
    from tileship.catalog import w4a16

    g = torch.Generator().manual_seed(3)
    n, k = 48, 1024
    qw = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, generator=g)
    scales = (torch.rand(n, k // w4a16.GROUP, generator=g) * 2 + 1e-3).to(dtype)
    nib = torch.stack([(qw >> (4 * j)) & 0xF for j in range(8)], dim=-1)  # nibble order
    elems = torch.empty_like(nib)
    elems[..., list(w4a16.PERM)] = nib  # nibble j holds element PERM[j]
    want = ((elems.reshape(n, k).float() - 8) * scales.float().repeat_interleave(w4a16.GROUP, dim=1)).to(dtype)
    got = w4a16.dequantize(qw, scales)
    assert got.dtype == dtype and torch.equal(got, want)


def test_gqa_decode_launch_forms() -> None:
    """split: two kernels and a workspace; one split: one kernel, no workspace; cluster: one
    kernel whose CTAs meet at the cluster barrier before and after writing into CTA 0."""
    pytest.importorskip("tilelang")
    from tileship.catalog import gqa_split

    def script(*args: int, **kw: Any) -> tuple[str, int]:
        text = str(gqa_decode.gqa_decode(*args, **kw).script())
        return text, text.count("tl.launch_threads")  # one per kernel launch

    split, kernels = script(1, 1024)
    assert kernels == 2 and "o_part = T.sblock_alloc_buffer" in split
    single, kernels = script(32, 8192)  # 256 (sequence, head) pairs: one split
    assert gqa_split.pick_split(32, 8192) == 1
    assert kernels == 1 and "o_part" not in single and "cluster" not in single
    cluster, kernels = script(1, 8192, launch="cluster")
    assert kernels == 1 and "cluster_dims" in cluster and "o_part" not in cluster
    assert cluster.count("cluster_sync") == 2
    assert gqa_split.split_plan(1, 8192, 32, 8, 128, 64, 16, cap=gqa_split.MAX_CLUSTER)[0] == 16
    assert gqa_split.split_plan(1, 8192, 32, 8, 128, 64, 16)[0] == 32
    with pytest.raises(ValueError, match="launch"):
        gqa_decode.gqa_decode(1, 1024, launch="fused")
    with pytest.raises(ValueError, match="at most 16 splits"):
        gqa_decode.gqa_decode(1, 8192, launch="cluster", num_split=32)


def test_gqa_decode_one_split_builds_with_nvcc(tmp_path) -> None:
    """The one-split form (B=32) through the product's isolated build (TileLang + nvcc, sm_90a) here:
    one kernel in the device code, no workspace in the host code."""
    import shutil

    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from tileship.build.builder import compile_one

    spec = next(s for s in expand(gqa_decode.gqa) if s.dim_map()["B"] == 32 and s.dim_map()["S"] == 1024
                and s.dtype == "float16")
    r = compile_one(gqa_decode.gqa, spec, tmp_path / spec.id, timeout_s=300)
    assert r.ok, r.error
    device = "\n".join(p.read_text() for p in (tmp_path / spec.id).glob("*.cu") if "host" not in p.name)
    assert device.count("__global__") == 2  # one kernel: its declaration and its definition
    host = (tmp_path / spec.id / "host_kernel.cu").read_text()
    assert "TVMBackendAllocWorkspace" not in host


def test_w4a16_gemv3_async_ring() -> None:
    """``w4a16_gemv3(depth=D)``: the cp.async ring variant (its arithmetic checked on the GPU by the sweep)."""
    pytest.importorskip("tilelang")
    from tileship.catalog.w4a16_async import ASYNC_SRC, RING_ROW
    from tileship.catalog.w4a16_gemv import w4a16_gemv3

    split = str(w4a16_gemv3(1, 4096, 14336, rows=4, k_warps=2, depth=3).script())
    # 2 warps along K, 7 steps each, 3 in flight; a ring of 3 slots x 4 rows a warp
    assert "ts_w4_gemv3_async<__half2, __half, 1, 4, 7, 4, 3>" in split and "ts_w4_gemv3_steps" not in split
    assert f'ring = T.sblock_alloc_buffer(({2 * 3 * 4 * RING_ROW},), "int32", scope="shared.dyn")' in split
    rows = str(w4a16_gemv3(2, 4096, 4096, "bfloat16", rows=2, k_warps=1, n_warps=4, depth=4).script())
    assert "ts_w4_gemv3_async<__nv_bfloat162, __nv_bfloat16, 2, 2, 4, 2, 4>" in rows
    assert 'T.thread_binding(512, thread="blockIdx.x")' in rows  # 4096 rows / (2 rows x 4 warps)
    for bad in (-1, 9):
        with pytest.raises(ValueError, match="depth"):
            w4a16_gemv3(1, 4096, 14336, rows=4, k_warps=2, depth=bad)
    # a ring row is the 32 lanes' 16-byte chunks (128 words) and the step's 8 scales (4 words)
    assert RING_ROW == 128 + 4 and "slot + r * 132 + 4 * lane" in ASYNC_SRC and "slot + lane * 132 + 128" in ASYNC_SRC
    assert "cp.async.wait_group" in ASYNC_SRC and ASYNC_SRC.count("__syncwarp()") == 2
