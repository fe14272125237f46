"""GEMM with candidates (Option B): the catalog's GEMM plus tile shapes for small M and a split-K variant.

``tileship tune`` picks, per (N, K) and per bucket of M, the fastest verified candidate or keeps
cuBLAS (``torch.matmul``, the reference). Built by ``benchmarks/tuned/tileship.toml``:

- ``bM128-bN256``: the catalog's 128x256x64, 3-stage tile (large M);
- ``bM128-bN128``: a 128x128x64, 4-stage tile (medium M, twice the CTAs);
- ``bM64-bN64``: a 64x64x128 tile, one warpgroup (small M: N/64 CTAs);
- ``split_k4``: 64x64x64 with K split four ways: one launch zeroes C, the next adds each
  CTA's fp32 partial sum into it atomically (small M with a long K, 4x the CTAs);
- ``block_N64-threads1024-gemv_rows1-unroll8``: the GEMV-style kernel of ``catalog.gemv_kn`` (no
  tensor cores: 64 columns a block, B read once per row of M): M=1. Chosen by
  ``benchmarks/dev/gemv_kn_sweep.py`` on the H200 (``benchmarks/results/h200/round16/sweep3/``): at M=1,
  15.3 us against cuBLAS's 17.5 at 4096x4096 and 32.8-32.9 against 34.2-34.7 at the 11008 shapes;
  from M=2 on cuBLAS is as fast or faster, and past a few rows ``tileship tune`` prunes it;
- ``...-swap1``: the swapped-operand GEMM of ``catalog.gemm_small_m`` (N on the MMA's 64-row side, M on
  its narrow side), three tiles: 16 rows of M x 64 columns x 128 of K in 8 stages, the same with 32 rows,
  and 8 x 128 x 128 in 3 stages (N=11008). Chosen by the round-17 sweep on the H200
  (``benchmarks/results/h200/round17/sweep/``): at M=1-16 and N=K=4096 15.0-15.7 us against cuBLAS's
  17.3-17.7, 31.4-32.2 against 34.3-34.9 at K=11008, 31.1-32.1 against 33.2-34.1 at N=11008 (8 x 128).
"""

from typing import Any

import tilelang.language as T

from tileship.catalog import costs
from tileship.catalog import gemm as base
from tileship.catalog.gemm_small_m import matmul_swap
from tileship.catalog.gemv_kn import gemv_kn
from tileship.declare.spec import Operator


def matmul_split_k(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 64, block_N: int = 64,
                   block_K: int = 64, num_stages: int = 3, threads: int = 128, split_k: int = 4) -> Any:
    """C = A @ B with K split ``split_k`` ways; needs K % (split_k * block_K) == 0."""
    if K % (split_k * block_K):
        raise ValueError(f"K={K} is not a multiple of split_k * block_K = {split_k * block_K}")
    accum = "float32"
    k_part = K // split_k

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M and bx * block_N + j < N:
                    C[by * block_M + i, bx * block_N + j] = T.cast(0, dtype)
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            a_tile = T.alloc_shared((block_M, block_K), dtype)
            b_tile = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), accum)
            T.clear(acc)
            for k in T.Pipelined(k_part // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, bz * k_part + k * block_K], a_tile)
                T.copy(B[bz * k_part + k * block_K, bx * block_N], b_tile)
                T.gemm(a_tile, b_tile, acc)
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M and bx * block_N + j < N:
                    T.atomic_add(C[by * block_M + i, bx * block_N + j], T.cast(acc[i, j], dtype))

    return main


def matmul_tuned(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 128, block_N: int = 256,
                 block_K: int = 64, num_stages: int = 3, threads: int = 256, split_k: int = 1,
                 gemv_rows: int = 0, unroll: int = 8, swap: int = 0) -> Any:
    """The tiled GEMM of ``tileship.catalog.gemm`` (``split_k`` 1), its split-K form, with ``swap`` set the
    swapped-operand GEMM of ``catalog.gemm_small_m``, or with ``gemv_rows`` set the GEMV-style kernel
    (``block_N`` columns, ``threads``, ``gemv_rows`` rows of M a block)."""
    if swap:
        return matmul_swap(M, N, K, dtype, block_M, block_N, block_K, num_stages, threads, split_k)
    if gemv_rows:
        return gemv_kn(M, N, K, dtype, block_N, threads, gemv_rows, unroll)
    if split_k > 1:
        return matmul_split_k(M, N, K, dtype, block_M, block_N, block_K, num_stages, threads, split_k)
    return base.matmul(M, N, K, dtype, block_M, block_N, block_K, num_stages, threads)


gemm_tuned = Operator(
    name="gemm",
    factory=matmul_tuned,
    reference=base.gemm_reference,
    cost=costs.gemm,
    inputs=base.gemm.inputs,
    outputs=base.gemm.outputs,
    dtypes=base.gemm.dtypes,
    targets=base.gemm.targets,
    config={"block_K": 64, "split_k": 1},
    candidates=[
        {"block_M": 128, "block_N": 256, "num_stages": 3, "threads": 256},
        {"block_M": 128, "block_N": 128, "num_stages": 4, "threads": 256},
        {"block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 4, "threads": 128},
        {"block_M": 64, "block_N": 64, "num_stages": 3, "threads": 128, "split_k": 4},
        {"block_N": 64, "threads": 1024, "gemv_rows": 1, "unroll": 8},
        {"block_M": 16, "block_N": 64, "block_K": 128, "num_stages": 8, "threads": 128, "swap": 1},
        {"block_M": 32, "block_N": 64, "block_K": 128, "num_stages": 8, "threads": 128, "swap": 1},
        {"block_M": 8, "block_N": 128, "block_K": 128, "num_stages": 3, "threads": 128, "swap": 1},
    ],
    ranges=base.gemm.ranges,
    shapes=base.gemm.shapes,
    tolerances=base.gemm.tolerances,
)
