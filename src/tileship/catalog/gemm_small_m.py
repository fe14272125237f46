"""A tensor-core GEMM for small M with the operands swapped: ``C[M, N] = A[M, K] @ B[K, N]`` computed
as ``C^T = B^T A^T``, so that N fills the MMA's 64-row side and M its narrow side (8 or 16).

The tiled kernels of ``catalog.gemm`` put M on the MMA's row side: at M of 1 to 16 a 64-row tile
is mostly padding, and its shared memory, half of it A's empty rows, limits how many B tiles a
block keeps in flight. Swapped, a block owns ``block_N`` columns of C (the MMA's rows) and
``block_M`` rows of M (its columns): B's tile is ``block_K x block_N`` as before, A's only
``block_M x block_K``, so a deep pipeline of B tiles fits. ``split_k`` > 1 splits K across
``split_k`` blocks per tile (more blocks than N / ``block_N`` at N=4096): a first kernel zeroes C,
the second adds each block's fp32 partial sum into it atomically, so the result's rounding
depends on the order the blocks finish in (within the operator's tolerance).

M is dynamic: rows past M are read as zeros and never written.

``linear_swap`` is the same kernel for ``F.linear``'s layout, ``Y[M, N] = X[M, K] @ W[N, K]^T``: the
weight's tile is ``block_N x block_K`` with K innermost, which is the layout the MMA's A operand
reads from shared memory natively (no transpose), so an ``nn.Linear`` weight is used as stored.
"""

from typing import Any

import tilelang.language as T

#: the shared memory a pipeline may take (of the H200's 227 KiB a block), checked by ``check``
SMEM_LIMIT = 200 * 1024


def smem_bytes(block_M: int, block_N: int, block_K: int, num_stages: int) -> int:
    """The shared memory of ``num_stages`` fp16/bf16 tiles of A and B."""
    return num_stages * (block_M + block_N) * block_K * 2


def check(N: int, K: int, block_M: int, block_N: int, block_K: int, num_stages: int, split_k: int) -> None:
    """Raise ValueError for a shape or a tile this kernel cannot cover (or whose pipeline does not fit
    in 200 KiB of shared memory)."""
    if N % block_N or K % (block_K * split_k):
        raise ValueError(f"gemm_small_m needs N % {block_N} == 0 and K % {block_K * split_k} == 0 (N={N}, K={K})")
    if block_M % 8 or block_M > 64 or block_N % 64:
        raise ValueError(f"gemm_small_m: block_M={block_M} must be 8..64 in steps of 8, block_N={block_N} "
                         "a multiple of 64")
    if smem_bytes(block_M, block_N, block_K, num_stages) > SMEM_LIMIT:
        raise ValueError(f"gemm_small_m: {num_stages} stages of {block_M + block_N}x{block_K} do not fit")


def matmul_swap(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 16, block_N: int = 64,
                block_K: int = 128, num_stages: int = 4, threads: int = 128, split_k: int = 1) -> Any:
    """The swapped-operand GEMM (see the module doc). ``M`` may be ``T.dynamic``."""
    check(N, K, block_M, block_N, block_K, num_stages, split_k)
    if split_k > 1:
        return _swap_split(M, N, K, dtype, block_M, block_N, block_K, num_stages, threads, split_k)
    accum = "float32"

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            a_tile = T.alloc_shared((block_M, block_K), dtype)
            b_tile = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_N, block_M), accum)
            T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], a_tile)
                T.copy(B[k * block_K, bx * block_N], b_tile)
                T.gemm(b_tile, a_tile, acc, transpose_A=True, transpose_B=True)
            for j, i in T.Parallel(block_N, block_M):
                if by * block_M + i < M:
                    C[by * block_M + i, bx * block_N + j] = T.cast(acc[j, i], dtype)

    return main


def linear_swap(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 8, block_N: int = 64,
                block_K: int = 256, num_stages: int = 4, threads: int = 128) -> Any:
    """``Y = X @ W^T`` with ``W`` ``[N, K]`` (``nn.Linear``'s weight), swapped as in the module doc: a
    block owns ``block_N`` outputs (the MMA's rows) of ``block_M`` rows of X. ``M`` may be ``T.dynamic``."""
    check(N, K, block_M, block_N, block_K, num_stages, 1)
    accum = "float32"

    @T.prim_func
    def main(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            x_tile = T.alloc_shared((block_M, block_K), dtype)
            w_tile = T.alloc_shared((block_N, block_K), dtype)
            acc = T.alloc_fragment((block_N, block_M), accum)
            T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(X[by * block_M, k * block_K], x_tile)
                T.copy(W[bx * block_N, k * block_K], w_tile)
                T.gemm(w_tile, x_tile, acc, transpose_B=True)
            for j, i in T.Parallel(block_N, block_M):
                if by * block_M + i < M:
                    Y[by * block_M + i, bx * block_N + j] = T.cast(acc[j, i], dtype)

    return main


def _swap_split(M: Any, N: int, K: int, dtype: str, block_M: int, block_N: int, block_K: int, num_stages: int,
                threads: int, split_k: int) -> Any:
    accum = "float32"
    k_part = K // split_k

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M:
                    C[by * block_M + i, bx * block_N + j] = T.cast(0, dtype)
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            a_tile = T.alloc_shared((block_M, block_K), dtype)
            b_tile = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_N, block_M), accum)
            T.clear(acc)
            for k in T.Pipelined(k_part // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, bz * k_part + k * block_K], a_tile)
                T.copy(B[bz * k_part + k * block_K, bx * block_N], b_tile)
                T.gemm(b_tile, a_tile, acc, transpose_A=True, transpose_B=True)
            for j, i in T.Parallel(block_N, block_M):
                if by * block_M + i < M:
                    T.atomic_add(C[by * block_M + i, bx * block_N + j], T.cast(acc[j, i], dtype))

    return main
