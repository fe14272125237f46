"""The W4A16 GEMVs, for decode batches (static M of 1 to 8).

- ``w4a16_gemv``: one warp owns ``rows`` output rows; lane ``kr`` owns the 8-weight chunks
  ``kr, kr + 32, ...`` of a step, so both the packed weights and the activations are read
  coalesced; fp16/bf16 packed FMAs over 8 (fp16) or 4 (bf16) products, fp32 across them, one
  warp all-reduce per output at the end.
- ``w4a16_gemv3``: K split across the warps of a block, each lane streaming 16-byte weight loads
  (32 weights, one scale group) issued before any decode; the partial sums meet through shared
  memory. It is the one the catalog uses at M=1 (measured: ``benchmarks/dev/w4a16_sweep.py``).
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_async import ASYNC_SRC, RING_ROW
from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types


@T.macro
def warp_sum(acc, i, red, kr):
    """``red[0]`` = the sum of ``acc[i]`` over the 32 lanes of the warp (lane index ``kr``)."""
    with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, "float32")]), "reduce_scope",
                T.reinterpret(T.uint64(0), dtype="handle")):
        T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[i], True, red[0], kr, dtype="handle"))


@T.macro
def block_sum_store(acc, part, red, tot, kr, wy, C, warps, outs, M, row0, dtype):
    """The K-split GEMVs' end: each warp's ``outs`` partial sums meet in ``part`` (one row a warp ``wy``);
    lanes ``kr < outs`` of warp 0 add them up and store output ``kr`` (column ``kr % M``, row ``row0 + kr // M``)."""
    for i in T.unroll(outs):
        warp_sum(acc, i, red, kr)
        if kr == 0:
            part[wy, i] = red[0]
    if wy == 0 and kr < outs:
        tot[0] = 0.0
        for w in T.unroll(warps):
            tot[0] += part[w, kr]
        C[kr % M, row0 + kr // M] = T.cast(tot[0], dtype)


@T.macro
def warp_sum_store(acc, red, kr, C, outs, M, row0, dtype):
    """The row-split GEMVs' end: each of the warp's ``outs`` sums stored by lane 0 (column ``i % M``, row
    ``row0 + i // M``)."""
    for i in T.unroll(outs):
        warp_sum(acc, i, red, kr)
        if kr == 0:
            C[i % M, row0 + i // M] = T.cast(red[0], dtype)


def device_step(fn: str, K: int, A: Any, B: Any, S: Any, acc: Any, row: Any, b_col: Any, a_col: Any, s_col: Any) -> Any:
    """The call of the device function ``fn`` (``w4a16_device``): packed weights from ``B[row, b_col]``,
    activations from ``A[0, a_col]`` and scales from ``S[row, s_col]``, each with its row stride, the
    products added to ``acc``. A plain function, not a macro: its indices stay expressions, not lets."""
    return T.call_extern("handle", fn, T.address_of(B[row, b_col]), K // 8, T.address_of(A[0, a_col]), K,
                         T.address_of(S[row, s_col]), K // GROUP, T.access_ptr(acc, "rw"))


def w4a16_gemv(M: int, N: int, K: int, dtype: str = "float16", rows: int = 2, n_warps: int = 4, nw: int = 2,
               unroll: bool = True) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M; ``nw`` words of 8 weights per lane per K step."""
    block_k = 32 * nw * 8
    if K % block_k or N % (rows * n_warps):
        raise ValueError(f"w4a16_gemv needs K % {block_k} == 0 and N % {rows * n_warps} == 0 (K={K}, N={N})")
    pair, scalar, chain = device_types(dtype)
    step = f"ts_w4_gemv_step<{pair}, {scalar}, {nw}, {M}, {rows}, {chain}>"

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (rows * n_warps), threads=(32, n_warps)) as bx:
            acc = T.alloc_local((rows * M,), "float32")
            red = T.alloc_local((1,), "float32")
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            ni = T.thread_binding(0, n_warps, thread="threadIdx.y")
            T.import_source(DEVICE_SRC)
            for i in T.unroll(rows * M):
                acc[i] = 0.0
            for ko in (T.unroll if unroll else T.serial)(K // block_k):
                device_step(step, K, A, B, S, acc, (bx * n_warps + ni) * rows, ko * 32 * nw + kr,
                            (ko * 32 * nw + kr) * 8, ko * 2 * nw + kr // 16)
            for i in T.unroll(rows * M):
                warp_sum(acc, i, red, kr)
                if kr == 0:
                    C[i % M, (bx * n_warps + ni) * rows + i // M] = T.cast(red[0], dtype)

    return main


def w4a16_gemv3(M: int, N: int, K: int, dtype: str = "float16", rows: int = 2, k_warps: int = 4,
                n_warps: int = 1, depth: int = 0) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M, K split across ``k_warps`` warps of a block.

    A block owns ``rows * n_warps`` output rows. Each of its ``k_warps`` warps along K streams
    ``K / 1024 / k_warps`` steps of 1024 weights a row with 16-byte loads issued before any
    decode; the partial sums meet in one block all-reduce (a warp all-reduce when ``k_warps`` is 1).
    With ``depth`` D > 0 the weights and scales reach registers through a ring of D shared-memory
    slots a warp filled by ``cp.async`` (``w4a16_async``), D steps in flight, D at most 8.
    """
    steps = K // 1024
    if K % 1024 or steps % k_warps or N % (rows * n_warps):
        raise ValueError(f"w4a16_gemv3 needs K % 1024 == 0, (K / 1024) % {k_warps} == 0 and N % {rows * n_warps} == 0"
                         f" (K={K}, N={N})")
    if k_warps > 1 and (n_warps > 1 or rows * M > 32):
        raise ValueError("w4a16_gemv3 splits a block along K or along N, not both, and sums at most 32 outputs a block")
    if not 0 <= depth <= 8:
        raise ValueError(f"w4a16_gemv3 keeps 1 to 8 K steps in flight with depth > 0, not depth={depth}")
    pair, scalar, chain = device_types(dtype)
    per_warp = steps // k_warps
    fn = f"ts_w4_gemv3_steps<{pair}, {scalar}, {M}, {rows}, {per_warp}, {chain}>"
    threads = (32, k_warps) if k_warps > 1 else (32, n_warps)
    if depth:
        return _gemv3_async(M, N, K, dtype, rows, threads, per_warp, depth, k_warps > 1)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (rows * n_warps), threads=threads) as bx:
            acc = T.alloc_local((rows * M,), "float32")
            red = T.alloc_local((1,), "float32")
            tot = T.alloc_local((1,), "float32")
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            wy = T.thread_binding(0, threads[1], thread="threadIdx.y")
            T.import_source(DEVICE_SRC)
            for i in T.unroll(rows * M):
                acc[i] = 0.0
            if k_warps > 1:
                part = T.alloc_shared((k_warps, rows * M), "float32")
                device_step(fn, K, A, B, S, acc, bx * rows, wy * per_warp * 128 + kr * 4,
                            wy * per_warp * 1024 + kr * 32, wy * per_warp * 8 + kr // 4)
                block_sum_store(acc, part, red, tot, kr, wy, C, k_warps, rows * M, M, bx * rows, dtype)
            else:
                device_step(fn, K, A, B, S, acc, (bx * n_warps + wy) * rows, kr * 4, kr * 32, kr // 4)
                warp_sum_store(acc, red, kr, C, rows * M, M, (bx * n_warps + wy) * rows, dtype)

    return main


def _gemv3_async(M: int, N: int, K: int, dtype: str, rows: int, threads: tuple[int, int], per_warp: int, depth: int,
                 k_split: bool) -> Any:
    """``w4a16_gemv3`` with its weights streamed through a ``cp.async`` ring of ``depth`` slots a warp."""
    pair, scalar, chain = device_types(dtype)
    fn = f"ts_w4_gemv3_async<{pair}, {scalar}, {M}, {rows}, {per_warp}, {chain}, {depth}>"
    warps = threads[1]
    ring_words = depth * rows * RING_ROW

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (rows * (1 if k_split else warps)), threads=threads) as bx:
            acc = T.alloc_local((rows * M,), "float32")
            red = T.alloc_local((1,), "float32")
            tot = T.alloc_local((1,), "float32")
            ring = T.alloc_shared((warps * ring_words,), "int32")
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            wy = T.thread_binding(0, warps, thread="threadIdx.y")
            T.import_source(DEVICE_SRC + ASYNC_SRC)
            for i in T.unroll(rows * M):
                acc[i] = 0.0
            row = bx * rows if k_split else (bx * warps + wy) * rows
            k0 = wy * per_warp if k_split else 0
            T.call_extern("handle", fn, T.address_of(B[row, k0 * 128]), K // 8, T.address_of(A[0, k0 * 1024]), K,
                          T.address_of(S[row, k0 * 8]), K // GROUP, T.access_ptr(acc, "rw"),
                          T.address_of(ring[wy * ring_words]))
            if k_split:
                part = T.alloc_shared((warps, rows * M), "float32")
                block_sum_store(acc, part, red, tot, kr, wy, C, warps, rows * M, M, bx * rows, dtype)
            else:
                warp_sum_store(acc, red, kr, C, rows * M, M, row, dtype)

    return main
