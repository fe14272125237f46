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
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog.gemm import matmul_fields
from tileship.catalog.w4a16 import LLAMA3_8B
from tileship.declare.spec import Operator, Tolerance

#: the decode batches compiled as static specializations: past M=2 cuBLAS wins (M=4: 0.62-0.94x,
#: M=8: 0.33-0.71x of cuBLAS at every block shape, ``benchmarks/results/h200/round4b/gemv_sweep.json``)
DECODE_M = (1, 2)
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
    factory=linear_gemv,
    reference=linear_reference,
    **matmul_fields("x", "weight", "y", b_dims=("N", "K")),
    shapes=tuple({"M": m, "N": n, "K": k} for _, n, k in LLAMA3_8B for m in DECODE_M),
    tolerances={"float16": Tolerance(atol=1e-2, rtol=1e-2), "bfloat16": Tolerance(atol=4e-2, rtol=4e-2)},
    sample=linear_sample,
)
