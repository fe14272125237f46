"""The W4A16 tensor-core GEMMs: prefill (any M, ``T.dynamic`` included) and decode batches of 8 and up.

Each K step is one 128-weight scale group. Three ways to feed the packed weights to the MMA:
- ``w4a16_gemm``: x is the MMA's wide operand; the weight tile is decoded into shared memory;
- ``w4a16_gemm_swap``: y^T = W x^T, so the weight tile fills the wide side and the few
  activation rows the narrow one (decode batches); decoded into shared memory;
- ``w4a16_gemm_rs``: as ``swap``, with each thread decoding the weights its register fragment
  holds, so no decoded tile goes through shared memory.
All three share the launch: one kernel over (N tiles, M tiles), or with ``split_k`` > 1 a kernel
over (N tiles, M tiles, K splits) writing fp32 partials to a workspace (``T.alloc_global``) and
a second kernel that sums them. Which one serves which shape is measured
(``benchmarks/dev/w4a16_sweep.py``) and chosen in ``w4a16.w4a16_linear``.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types


def _check(name: str, N: int, K: int, block_N: int, split_k: int, dtype: str) -> int:
    """K steps per split; raises ValueError for a shape the tiling does not cover."""
    if K % (GROUP * split_k) or N % block_N:
        raise ValueError(f"{name} needs K % {GROUP * split_k} == 0 and N % {block_N} == 0 (K={K}, N={N})")
    device_types(dtype)
    return K // GROUP // split_k


def _launch(tile: Any, M: Any, N: int, K: int, dtype: str, block_M: int, block_N: int, split_k: int,
            threads: int, vector_sum: bool = False) -> Any:
    """The prim_func running ``tile(A, B, S, out, bx, by, bz, to_workspace)`` over the grid. With
    ``split_k`` > 1 a second kernel sums the fp32 partials: one output a thread, the splits in a loop
    (about 4 us at M=32, N=4096, split 8 under Nsight Compute on an H100, round 29, with no eligible warp
    in 94% of cycles), or with ``vector_sum`` (N % 1024 == 0) four outputs a thread and the split loop
    unrolled, so that every split's load can be in flight at once."""
    if split_k == 1:
        @T.prim_func
        def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                 S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
            with T.Kernel(N // block_N, T.ceildiv(M, block_M), threads=threads) as (bx, by):
                tile(A, B, S, C, bx, by, 0, False)

        return main

    @T.prim_func
    def main_split(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                   S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(N // block_N, T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            tile(A, B, S, ws, bx, by, bz, True)
        with T.Kernel(N // 256, M, threads=256) as (bx, by):
            for i in T.Parallel(256):
                total = T.alloc_var("float32")
                total = 0.0
                for s in T.serial(split_k):
                    total += ws[s, by, bx * 256 + i]
                C[by, bx * 256 + i] = T.cast(total, dtype)

    @T.prim_func
    def main_split_vec(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                       S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(N // block_N, T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            tile(A, B, S, ws, bx, by, bz, True)
        with T.Kernel(N // 1024, M, threads=256) as (bx, by):
            part = T.alloc_fragment((1024,), "float32")
            for i in T.Parallel(1024):
                part[i] = ws[0, by, bx * 1024 + i]
            for s in T.unroll(split_k - 1):
                for i in T.Parallel(1024):
                    part[i] += ws[s + 1, by, bx * 1024 + i]
            for i in T.Parallel(1024):
                C[by, bx * 1024 + i] = T.cast(part[i], dtype)

    if vector_sum:
        if N % 1024:
            raise ValueError(f"the vectorized split-K sum needs N % 1024 == 0 (N={N})")
        return main_split_vec
    return main_split


def _launch_cluster(tile: Any, M: int, N: int, K: int, dtype: str, block_M: int, block_N: int, split_k: int,
                    threads: int) -> Any:
    """The prim_func for ``reduce="cluster"``: the ``split_k`` CTAs of one output tile form a thread-block
    cluster; each leaves its fp32 partial in its shared memory (``tile(..., to_workspace=None)`` returns
    nothing: ``part`` is written by the store), sends it into CTA 0's shared memory, and after the
    cluster barrier CTA 0 sums the partials and writes C. One launch, no workspace, no second kernel."""

    @T.prim_func
    def main_cluster(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                     S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.ClusterKernel(split_k, N // block_N, T.ceildiv(M, block_M), cluster_dims=(split_k, 1, 1),
                             threads=threads) as (bz, bx, by):
            part = T.alloc_shared((block_N, block_M), "float32")
            parts = T.alloc_shared((split_k, block_N, block_M), "float32")
            tile(A, B, S, part, bx, by, bz, None)
            # every CTA done with its tiles before anything lands in CTA 0's shared memory: its
            # pipeline buffers and ``parts`` do not overlap in time in CTA 0's own program
            T.cluster_sync()
            T.copy_cluster(part, parts[bz, :, :], dst_block=0)
            T.cluster_sync()
            if bz == 0:
                for i, j in T.Parallel(block_N, block_M):
                    total = T.alloc_var("float32")
                    total = 0.0
                    for s in T.unroll(split_k):
                        total += parts[s, i, j]
                    C[by * block_M + j, bx * block_N + i] = T.cast(total, dtype)

    return main_cluster


def _decode_to_shared(dtype: str, block_N: int, threads: int, ks: int) -> Any:
    """A macro: the packed tile ``B_sh`` [block_N, 16] -> scaled ``b_sh`` [block_N, 128], 8 weights a call."""
    dq8 = f"ts_w4_dq8<{device_types(dtype)[0]}>"

    @T.macro
    def decode(B_sh, S, b_sh, b_loc, tx, bx, bz, k):
        for it in T.unroll(block_N * GROUP // 8 // threads):
            T.call_extern("handle", dq8, B_sh[(it * threads + tx) // (GROUP // 8), (it * threads + tx) % (GROUP // 8)],
                          T.cast(S[bx * block_N + (it * threads + tx) // (GROUP // 8), bz * ks + k], "float32"),
                          T.access_ptr(b_loc, "w"))
            for v in T.vectorized(8):
                b_sh[(it * threads + tx) // (GROUP // 8), ((it * threads + tx) % (GROUP // 8)) * 8 + v] = b_loc[v]

    return decode


def _store_transposed(dtype: str, block_M: int, block_N: int) -> Any:
    """A macro: the [block_N, block_M] accumulator of y^T -> its [block_M, block_N] tile of y (or of a partial)."""

    @T.macro
    def store(acc, out, bx, by, bz, to_workspace: bool | None):
        if to_workspace is None:  # the cluster launch: this CTA's own partial, in its shared memory
            T.copy(acc, out)
        else:
            for i, j in T.Parallel(block_N, block_M):
                if to_workspace:
                    out[bz, by * block_M + j, bx * block_N + i] = acc[i, j]
                else:
                    out[by * block_M + j, bx * block_N + i] = T.cast(acc[i, j], dtype)

    return store


def _shared_tile(dtype: str, block_M: int, block_N: int, threads: int, ks: int, num_stages: int, swap: bool) -> Any:
    """The tile macro of ``w4a16_gemm`` (x on the MMA's wide side) or ``w4a16_gemm_swap`` (W there)."""
    decode = _decode_to_shared(dtype, block_N, threads, ks)
    store_transposed = _store_transposed(dtype, block_M, block_N)
    acc_shape = (block_N, block_M) if swap else (block_M, block_N)

    @T.macro
    def tile(A, B, S, out, bx, by, bz, to_workspace: bool):
        a_sh = T.alloc_shared((block_M, GROUP), dtype)
        bq_sh = T.alloc_shared((block_N, GROUP // 8), "int32")
        b_sh = T.alloc_shared((block_N, GROUP), dtype)
        acc = T.alloc_fragment(acc_shape, "float32")
        b_loc = T.alloc_local((8,), dtype)
        tx = T.get_thread_binding()
        T.import_source(DEVICE_SRC)
        T.clear(acc)
        for k in T.Pipelined(ks, num_stages=num_stages):
            T.copy(A[by * block_M, (bz * ks + k) * GROUP], a_sh)
            T.copy(B[bx * block_N, (bz * ks + k) * (GROUP // 8)], bq_sh)
            decode(B_sh=bq_sh, S=S, b_sh=b_sh, b_loc=b_loc, tx=tx, bx=bx, bz=bz, k=k)
            if swap:
                T.gemm(b_sh, a_sh, acc, transpose_B=True)
            else:
                T.gemm(a_sh, b_sh, acc, transpose_B=True)
        if swap:
            store_transposed(acc, out, bx, by, bz, to_workspace)
        elif to_workspace:
            T.copy(acc, out[bz, by * block_M, bx * block_N])
        else:
            T.copy(acc, out[by * block_M, bx * block_N])

    return tile


def w4a16_gemm(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 64, block_N: int = 128,
               split_k: int = 1, num_stages: int = 3, threads: int = 128) -> Any:
    """y = x @ W^T through tensor cores; ``M`` may be ``T.dynamic``."""
    ks = _check("w4a16_gemm", N, K, block_N, split_k, dtype)
    tile = _shared_tile(dtype, block_M, block_N, threads, ks, num_stages, swap=False)
    return _launch(tile, M, N, K, dtype, block_M, block_N, split_k, threads)


def w4a16_gemm_swap(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 16, block_N: int = 128,
                    split_k: int = 1, num_stages: int = 3, threads: int = 128) -> Any:
    """y^T = W x^T with the weight tile decoded into shared memory (the MMA's wide operand)."""
    ks = _check("w4a16_gemm_swap", N, K, block_N, split_k, dtype)
    tile = _shared_tile(dtype, block_M, block_N, threads, ks, num_stages, swap=True)
    return _launch(tile, M, N, K, dtype, block_M, block_N, split_k, threads)


def _bq_swizzle(i: Any, j: Any) -> list[Any]:
    """Where word j of row i of the packed [rows, 16] tile lives: its 16-byte chunk j // 4 XOR
    ((i >> 1) & 3), so rows g = 0..7 of an MMA row group read 8 distinct banks (cp.async keeps 16 bytes)."""
    return [i, ((j // 4) ^ ((i >> 1) % 4)) * 4 + j % 4]


def w4a16_gemm_rs(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 16, block_N: int = 128,
                  split_k: int = 1, num_stages: int = 3, threads: int = 128, decode: str = "cast",
                  reduce: str = "workspace", swizzle: bool = False, scales: str = "shared",
                  rows_per_warpgroup: bool = False) -> Any:
    """y^T = W x^T with each thread decoding the weights of its register fragment (no shared tile).

    ``decode``: ``cast`` converts each nibble with an int-to-float conversion (a quarter-rate
    instruction on sm_90); ``lop3`` builds each pair with one LOP3 into the exponent's magic
    number (``ts_w4_elem`` in ``w4a16_device``), the trick the shared-memory and GEMV kernels use; same values.
    ``pair`` decodes each pair of adjacent weights with one call (``ts_w4_pair``): one LOP3, one packed
    subtract and one packed multiply for both, half the decode instructions of ``lop3`` in the PTX of
    the M=8 kernel; same values; on the H200 it times the same as ``lop3`` at M = 4-32 (round 12,
    ``benchmarks/results/h200/round12/w4a16_sweep_pair.json.xz``): the decode's ALU work is not the limit.
    ``swizzle``: the packed tile's 16-byte chunks XOR-permuted by row (``_bq_swizzle``). In the MMA's
    register layout the 8 row groups of a warp read one word each per instruction; unswizzled, those
    rows are 16 words apart, so they fall in 2 banks: a 4-way shared-memory bank conflict on every
    weight load. Swizzled, they hit 8 distinct banks, and the kernel runs about as fast (round 12,
    ``decode_kernels.py`` at bf16 M=16, each against cuBLAS in its own run: down 1.84x vs 1.85x, o 1.42x
    vs 1.40x, lm_head 2.32x vs 2.23x): shared-memory bandwidth is not the limit either.
    ``scales``: ``shared`` copies the block's scales into shared memory before the K loop, and the
    generated code waits for that copy (one memory latency) before it issues the first weight copy;
    ``global`` reads each scale where the decode uses it (two loads a thread a K step, cached), so
    the weight pipeline starts at once (not yet timed on the GPU).
    ``reduce`` (with ``split_k`` > 1): ``workspace`` (fp32 partials in global memory, a second kernel sums
    them), ``vector`` (the same, the sum kernel's loads all in flight: ``_launch``'s ``vector_sum``) or
    ``cluster`` (the splits of a tile form a thread-block cluster and reduce in CTA 0's shared
    memory: one launch; ``split_k`` <= 8, static M). The cluster form measured slower at every shape on
    the H200 (down M=8: 23.6 vs 21.3 us; lm_head at 8 splits 345 vs 106 us: a cluster of 8 waits for 8
    free SMs in one GPC), ``benchmarks/results/h200/round12/w4a16_sweep_cluster.json.xz``.
    (Scaling each group's fp32 partial sums instead of every weight measured no faster on the
    H200: ``benchmarks/results/h200/round11/w4a16_sweep_post.json``.)
    ``rows_per_warpgroup``: each warpgroup takes 64 of the block's weight rows and every activation column
    (TileLang's ``FullRow`` warp policy; the default gave each warpgroup all rows and half the columns, so at
    256 threads both decoded every weight). With ``block_N`` 128 or 256 the block's activation tile serves
    128-256 rows; on the H200 this was within the spread of the 64-row rule at M = 16 and 32 (down, gate_up,
    o) and slower at qkv (``benchmarks/results/h200/round30/sweep/``), so the catalog does not use it."""
    ks = _check("w4a16_gemm_rs", N, K, block_N, split_k, dtype)
    policy = T.GemmWarpPolicy.FullRow if rows_per_warpgroup else T.GemmWarpPolicy.Square
    if decode not in ("cast", "lop3", "pair"):
        raise ValueError(f"w4a16_gemm_rs: decode must be 'cast', 'lop3' or 'pair', got {decode!r}")
    store_transposed = _store_transposed(dtype, block_M, block_N)
    types = ("__half2, __half, 0x64006400u, 0x64086408u" if dtype == "float16"
             else "__nv_bfloat162, __nv_bfloat16, 0x43004300u, 0x43084308u")
    elem, pair = f"ts_w4_elem<{types}>", f"ts_w4_pair<{types}>"

    @T.macro
    def tile(A, B, S, out, bx, by, bz, to_workspace: bool):
        a_sh = T.alloc_shared((block_M, GROUP), dtype)
        bq_sh = T.alloc_shared((block_N, GROUP // 8), "int32")
        b_frag = T.alloc_fragment((block_N, GROUP), dtype)
        s_sh = T.alloc_shared((block_N, ks), dtype)
        acc = T.alloc_fragment((block_N, block_M), "float32")
        if swizzle:
            T.annotate_layout({bq_sh: _bq_swizzle})
        if decode != "cast":
            T.import_source(DEVICE_SRC)
        T.clear(acc)
        if scales == "shared":
            T.copy(S[bx * block_N, bz * ks], s_sh)
        for k in T.Pipelined(ks, num_stages=num_stages):
            T.copy(A[by * block_M, (bz * ks + k) * GROUP], a_sh)
            T.copy(B[bx * block_N, (bz * ks + k) * (GROUP // 8)], bq_sh)
            # element j % 8 of a word sits in nibble (j % 2) * 4 + (j % 8) // 2 (see PERM in w4a16.py);
            # (q - 8) is exact in fp16/bf16, so the one rounding is the product's, as in the reference
            if decode == "pair":  # pair jp = weights 2 jp, 2 jp + 1: adjacent in the fragment's registers
                for i, jp in T.Parallel(block_N, GROUP // 2):
                    if scales == "global":
                        T.call_extern("handle", pair, T.address_of(b_frag[i, jp * 2]), bq_sh[i, jp // 4], jp % 4,
                                      S[bx * block_N + i, bz * ks + k])
                    else:
                        T.call_extern("handle", pair, T.address_of(b_frag[i, jp * 2]), bq_sh[i, jp // 4], jp % 4,
                                      s_sh[i, k])
            else:
                for i, j in T.Parallel(block_N, GROUP):
                    if decode == "lop3" and scales == "global":
                        b_frag[i, j] = T.call_extern(dtype, elem, bq_sh[i, j // 8], j % 8,
                                                     S[bx * block_N + i, bz * ks + k])
                    elif decode == "lop3":
                        b_frag[i, j] = T.call_extern(dtype, elem, bq_sh[i, j // 8], j % 8, s_sh[i, k])
                    else:
                        b_frag[i, j] = (T.cast((bq_sh[i, j // 8] >> (((j % 2) * 4 + (j % 8) // 2) * 4)) & 15,
                                               dtype) - T.cast(8, dtype)) * s_sh[i, k]
            T.gemm(b_frag, a_sh, acc, transpose_B=True, policy=policy)
        store_transposed(acc, out, bx, by, bz, to_workspace)

    if scales not in ("shared", "global") or (scales == "global" and decode == "cast"):
        raise ValueError(f"w4a16_gemm_rs: scales must be 'shared' or 'global' (not with decode='cast'), got {scales!r}")
    if reduce not in ("workspace", "vector", "cluster"):
        raise ValueError(f"w4a16_gemm_rs: reduce must be 'workspace', 'vector' or 'cluster', got {reduce!r}")
    if reduce == "cluster" and split_k > 1:
        if split_k > 8 or not isinstance(M, int):
            raise ValueError(f"w4a16_gemm_rs: reduce='cluster' needs split_k <= 8 and a static M (got {split_k}, {M})")
        return _launch_cluster(tile, M, N, K, dtype, block_M, block_N, split_k, threads)
    return _launch(tile, M, N, K, dtype, block_M, block_N, split_k, threads, vector_sum=reduce == "vector")
