"""A GEMV-style GEMM for small M in ``torch.matmul``'s layout: ``C[M, N] = A[M, K] @ B[K, N]``.

At decode sizes (M of 1 to 8) a matmul reads B once and does almost nothing with it, so its
time is B's bytes over the memory bandwidth; the tiled tensor-core kernels of
``catalog.gemm_tuned`` then leave most SMs idle (N / 64 CTAs) or wait on their pipeline.

The kernel: a block owns ``block_N`` columns and ``m_rows`` rows of C. Its threads are
``block_N / 8`` column lanes (one 16-byte load of 8 elements each, so a warp reads whole
64- or 128-byte row segments of B) times ``threads / (block_N / 8)`` K groups; K group ``g``
visits rows ``g, g + groups, g + 2 groups, ...``. Each thread issues ``unroll`` row loads before it
multiplies (fp32 accumulators, ``m_rows`` x 8 of them); the K groups of one warp then add their
partial sums with shuffles, the warps' sums meet in shared memory, and ``m_rows * block_N``
threads add those up. No tensor cores, no atomics: the
result does not depend on timing.

M is dynamic (the grid's y covers ``ceil(M / m_rows)`` blocks): every M is correct, but each
block reads all of B, so past a few blocks of rows the tiled kernels or cuBLAS win and
``tileship tune`` keeps them there.
"""

from typing import Any

import tilelang.language as T

VEC = 8  # fp16/bf16 elements in one 16-byte load


def check(N: int, K: int, block_N: int, threads: int, m_rows: int, unroll: int) -> int:
    """The number of K groups; raises ValueError for a shape this block cannot cover."""
    lanes = block_N // VEC
    if block_N % VEC or lanes > 32 or 32 % lanes or threads % 32:
        raise ValueError(f"gemv_kn: block_N={block_N} must be 8, 16, ... 256 (lanes dividing a warp) and "
                         f"threads={threads} whole warps")
    if N % block_N:
        raise ValueError(f"gemv_kn needs N % block_N == 0 (N={N}, block_N={block_N})")
    if m_rows * block_N > threads * 8 or unroll < 1 or m_rows < 1:
        raise ValueError(f"gemv_kn: m_rows={m_rows}, unroll={unroll} for {threads} threads")
    return threads // lanes


def gemv_kn(M: Any, N: int, K: int, dtype: str = "float16", block_N: int = 32, threads: int = 256,
            m_rows: int = 1, unroll: int = 16) -> Any:
    """The kernel for one (N, K) and any M (an int or ``T.dynamic``). K need not divide into the
    loads: past K a thread reads B's last row again (a valid address, unpredicated vector loads)
    and multiplies it by zero."""
    groups = check(N, K, block_N, threads, m_rows, unroll)
    lanes = block_N // VEC
    warps = threads // 32
    outer = -(-K // (groups * unroll))
    n_out = m_rows * block_N
    sums = (n_out + threads - 1) // threads  # outputs each thread adds up at the end
    deltas = [d for d in (1, 2, 4, 8, 16) if d >= lanes]  # shuffles across the K groups of one warp

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // block_N, T.ceildiv(M, m_rows), threads=threads) as (bx, by):
            tid = T.get_thread_binding(0)
            lane = tid % lanes
            group = tid // lanes
            b_reg = T.alloc_local((unroll * VEC,), dtype)
            a_reg = T.alloc_local((m_rows * unroll,), "float32")
            acc = T.alloc_local((m_rows * VEC,), "float32")
            part = T.alloc_shared((warps, n_out), "float32")
            total = T.alloc_local((1,), "float32")
            for i in T.unroll(m_rows * VEC):
                acc[i] = 0.0
            for s in T.serial(outer):
                for u in T.unroll(unroll):
                    for v in T.vectorized(VEC):
                        b_reg[u * VEC + v] = B[T.min((s * unroll + u) * groups + group, K - 1),
                                               bx * block_N + lane * VEC + v]
                for m in T.unroll(m_rows):
                    for u in T.unroll(unroll):
                        a_reg[m * unroll + u] = T.if_then_else(
                            (by * m_rows + m < M) and ((s * unroll + u) * groups + group < K),
                            T.cast(A[T.min(by * m_rows + m, M - 1), T.min((s * unroll + u) * groups + group, K - 1)],
                                   "float32"),
                            T.float32(0))
                for m in T.unroll(m_rows):
                    for u in T.unroll(unroll):
                        for v in T.unroll(VEC):
                            acc[m * VEC + v] += a_reg[m * unroll + u] * T.cast(b_reg[u * VEC + v], "float32")
            for i in T.unroll(m_rows * VEC):
                for d in T.unroll(len(deltas)):
                    acc[i] += T.shfl_xor(acc[i], T.int32(1) << (d + 5 - len(deltas)))
            if tid % 32 < lanes:
                for m in T.unroll(m_rows):
                    for v in T.unroll(VEC):
                        part[tid // 32, m * block_N + lane * VEC + v] = acc[m * VEC + v]
            T.sync_threads()
            for o in T.unroll(sums):
                if o * threads + tid < n_out:
                    total[0] = 0.0
                    for w in T.unroll(warps):
                        total[0] += part[w, o * threads + tid]
                    row = by * m_rows + (o * threads + tid) // block_N
                    if row < M:
                        C[row, bx * block_N + (o * threads + tid) % block_N] = T.cast(total[0], dtype)

    return main


def gemv_kn_pipe(M: Any, N: int, K: int, dtype: str = "float16", block_N: int = 64, block_K: int = 128,
                 threads: int = 128, m_rows: int = 1, num_stages: int = 4, split: int = 16) -> Any:
    """The same product with B streamed through shared memory by ``T.Pipelined`` copies (TMA on
    Hopper, ``num_stages`` tiles of ``block_K`` x ``block_N`` in flight a block); ``split`` rows of
    fp32 partial sums a column, added once at the end."""
    if N % block_N or K % block_K or block_K % split:
        raise ValueError(f"gemv_kn_pipe needs N % {block_N} == 0 and K % {block_K} == 0 (N={N}, K={K})")
    width = m_rows * block_N

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // block_N, T.ceildiv(M, m_rows), threads=threads) as (bx, by):
            a_sh = T.alloc_shared((m_rows, block_K), dtype)
            b_sh = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((split, width), "float32")
            out = T.alloc_fragment((width,), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                for m, i in T.Parallel(m_rows, block_K):
                    a_sh[m, i] = T.if_then_else(by * m_rows + m < M,
                                                A[T.min(by * m_rows + m, M - 1), k * block_K + i], T.cast(0, dtype))
                T.copy(B[k * block_K, bx * block_N], b_sh)
                for r, j in T.Parallel(split, width):
                    for kk in T.serial(block_K // split):
                        acc[r, j] += (T.cast(a_sh[j // block_N, kk * split + r], "float32")
                                      * T.cast(b_sh[kk * split + r, j % block_N], "float32"))
            T.reduce_sum(acc, out, dim=0)
            for j in T.Parallel(width):
                if by * m_rows + j // block_N < M:
                    C[by * m_rows + j // block_N, bx * block_N + j % block_N] = T.cast(out[j], dtype)

    return main
