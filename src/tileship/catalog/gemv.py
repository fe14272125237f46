"""fp16/bf16 ``linear`` for decode batches: ``y = x @ W^T`` (``F.linear``'s layout), a GEMV.

At decode sizes (M of 1 to 8 rows against a weight of millions) a linear layer reads its
weight once and does almost nothing with it: the time is the weight's bytes over the memory
bandwidth. cuBLAS reaches 55-67% of the H200's copy bandwidth on Llama-3-8B's qkv, o and down
projections at M=1 (``../shared/GPU_HOST.md``, 2026-11-30), which leaves room for a kernel
that only streams.

The kernel: a block of ``k_threads`` threads owns ``rows`` output rows of every one of the M
activation rows. Each thread issues all its 16-byte weight loads (``rows`` x K / (8 k_threads)
of them, coalesced along K) before any arithmetic, then multiplies in fp32 and the block sums
each output with one all-reduce. No shared-memory tiles, no tensor cores: at M <= 8 they have
nothing to do. The reference is ``F.linear`` (cuBLAS on CUDA): PyTorch's best path for a
dense fp16/bf16 linear; evidence routing serves whichever is faster per shape, on the GPU
that measured it.

From M=4 on the GEMV loses to cuBLAS, and ``linear_decode`` builds the swapped-operand tensor-core
GEMM of ``catalog.gemm_small_m`` (``linear_swap``) instead: N on the MMA's 64-row side, the M rows of
the batch on its 8- or 16-wide side, the weight read as stored ([N, K], K innermost) through a deep
TMA pipeline. Its tiles (``SWAP_TILES``) are the fastest of the round-17 sweep at Llama-3-8B's shapes
on the H200 (``benchmarks/results/h200/round17/llama_swap/best_per_shape.txt``, measured in the
[K, N] layout): 1.07-1.18x of the faster of cuBLAS's ``matmul`` and ``F.linear`` on qkv, o and down at
M=1-16, a tie on gate_up and lm_head, a loss from M=32 (not declared).

At M = 4..16 the operator also declares the 16-bit MMA-GEMV of ``catalog.linear_mma`` as tune candidates
(Option B): ``tileship tune`` routes a shape to one of them only where it verified and measured faster than
both this kernel and cuBLAS on the target GPU; an untuned release serves the kernel above.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog.gemm import matmul_fields
from tileship.catalog.gemm_small_m import SMEM_LIMIT, linear_swap, smem_bytes
from tileship.catalog.linear_mma import LINEAR_MV_CANDIDATES, linear_mv, mv_applies
from tileship.catalog.w4a16 import LLAMA3_8B
from tileship.declare.spec import Operator, Tolerance

#: the decode batches compiled as static specializations
DECODE_M = (1, 2, 4, 8, 16)
#: the largest M the GEMV serves: past M=2 cuBLAS wins against it (M=4: 0.62-0.94x, M=8: 0.33-0.71x of
#: cuBLAS at every block shape, ``benchmarks/results/h200/round4b/gemv_sweep.json``)
GEMV_MAX_M = 2
#: N -> (block_N, block_K, num_stages) of ``linear_swap`` for M <= 8 (block_M 8) and for M <= 16
#: (block_M 16), from the round-17 sweep (module doc); a shape not listed takes ``SWAP_DEFAULT``
SWAP_TILES = {4096: ((64, 256, 4), (64, 256, 4)), 6144: ((64, 256, 3), (64, 128, 6)),
              28672: ((128, 128, 3), (64, 256, 4)), 128256: ((128, 128, 4), (128, 128, 4))}
SWAP_DEFAULT = ((64, 256, 4), (64, 256, 4))
VEC = 8  # fp16/bf16 elements in one 16-byte load


def plan(M: int, N: int, K: int) -> tuple[int, int]:
    """(rows a block, threads a block along K) for one shape: one row a block, K / (8 threads)
    16-byte loads a row per thread (4 at K=4096, 7 at 14336). Measured at M=1 on the H200
    (``benchmarks/dev/gemv_sweep.py``): one row a block is the fastest or within 0.3 us of it on
    all five projections, 256 threads at K=14336 (36.8 vs 37.9 us with 128). A K that no block of
    32 or more threads divides is left for ``linear_gemv`` to refuse."""
    k_threads = 128 if K <= 8192 else 256
    while k_threads > 32 and K % (k_threads * VEC):
        k_threads //= 2
    return 1, k_threads


def linear_decode(M: int, N: int, K: int, dtype: str = "float16", mv_rt: int = 0, mv_wk: int = 8,
                  mv_unroll: int = 1) -> Any:
    """The kernel for one decode shape: the GEMV up to ``GEMV_MAX_M`` rows, else ``linear_swap`` with the
    tile ``swap_tile`` picks (M up to 64); with ``mv_rt`` set, the 16-bit MMA-GEMV of ``catalog.linear_mma``
    with that tiling (a tune candidate)."""
    if mv_rt:
        return linear_mv(M, N, K, dtype, rt=mv_rt, wk=mv_wk, unroll=mv_unroll)
    if M <= GEMV_MAX_M:
        return linear_gemv(M, N, K, dtype)
    block_M, (block_N, block_K, stages) = swap_tile(M, N, K)
    return linear_swap(M, N, K, dtype, block_M, block_N, block_K, stages, 128)


def swap_tile(M: int, N: int, K: int) -> tuple[int, tuple[int, int, int]]:
    """(block_M, (block_N, block_K, num_stages)) of ``linear_swap`` for one shape: ``SWAP_TILES`` by N,
    with block_K halved while it does not divide K."""
    small, wide = SWAP_TILES.get(N, SWAP_DEFAULT)
    block_M = 8 if M <= 8 else 16 if M <= 16 else 32 if M <= 32 else 64
    block_N, block_K, stages = small if block_M == 8 else wide
    while block_K > 64 and K % block_K:
        block_K //= 2
    while stages > 2 and smem_bytes(block_M, block_N, block_K, stages) > SMEM_LIMIT:
        stages -= 1
    return block_M, (block_N, block_K, stages)


def linear_gemv(M: int, N: int, K: int, dtype: str = "float16") -> Any:
    """The GEMV for one static shape, the block as ``plan`` picks it."""
    return gemv_kernel(M, N, K, dtype, *plan(M, N, K))


def gemv_kernel(M: int, N: int, K: int, dtype: str, rows: int, k_threads: int) -> Any:
    """The GEMV with ``rows`` output rows and ``k_threads`` threads along K a block."""
    if K % (k_threads * VEC) or N % rows:
        raise ValueError(f"linear_gemv needs K % {k_threads * VEC} == 0 (K={K}, N={N})")
    steps = K // (k_threads * VEC)

    @T.prim_func
    def main(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(N // rows, threads=k_threads) as bx:
            tk = T.get_thread_binding(0)
            w_reg = T.alloc_local((rows * steps * VEC,), dtype)
            x_reg = T.alloc_local((VEC,), dtype)
            acc = T.alloc_local((M * rows,), "float32")
            red = T.alloc_local((1,), "float32")
            for r in T.unroll(rows):
                for s in T.unroll(steps):
                    for v in T.vectorized(VEC):
                        w_reg[(r * steps + s) * VEC + v] = W[bx * rows + r, (s * k_threads + tk) * VEC + v]
            for i in T.unroll(M * rows):
                acc[i] = 0.0
            for s in T.unroll(steps):
                for m in T.unroll(M):
                    for v in T.vectorized(VEC):
                        x_reg[v] = X[m, (s * k_threads + tk) * VEC + v]
                    for r in T.unroll(rows):
                        for v in T.unroll(VEC):
                            acc[m * rows + r] += (T.cast(w_reg[(r * steps + s) * VEC + v], "float32")
                                                  * T.cast(x_reg[v], "float32"))
            for i in T.unroll(M * rows):
                with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, "float32")]), "reduce_scope",
                            T.reinterpret(T.uint64(0), dtype="handle")):
                    T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[i], True, red[0], tk, dtype="handle"))
                if tk == 0:
                    Y[i // rows, bx * rows + i % rows] = T.cast(red[0], dtype)

    return main


def linear_reference(x: Any, weight: Any) -> Any:
    """``F.linear`` without a bias: cuBLAS on CUDA, in x's dtype."""
    return torch.nn.functional.linear(x, weight)


def linear_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any]:
    """Activations ~ N(0, 1), weights ~ N(0, 1) / sqrt(K): outputs are O(1) whatever K is."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    dt = getattr(torch, dtype)
    x = torch.randn(m, k, device=device).to(dt)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dt)
    return x, w


linear = Operator(
    name="linear",
    factory=linear_decode,
    reference=linear_reference,
    **matmul_fields("x", "weight", "y", b_dims=("N", "K")),
    shapes=tuple({"M": m, "N": n, "K": k} for _, n, k in LLAMA3_8B for m in DECODE_M),
    tolerances={"float16": Tolerance(atol=1e-2, rtol=1e-2), "bfloat16": Tolerance(atol=4e-2, rtol=4e-2)},
    sample=linear_sample,
    # the kernel above first (what an untuned release serves), then the MMA-GEMV's tilings where they apply
    candidates=[{}, *LINEAR_MV_CANDIDATES],
    applies=mv_applies,
)
