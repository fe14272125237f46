"""GEMM C = A @ B on Hopper (wgmma through T.gemm), fp16/bf16 in, fp32 accumulate."""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.declare.spec import DynamicRange, Operator, TensorArg, Tolerance


def matmul(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 128, block_N: int = 256,
           block_K: int = 64, num_stages: int = 3, threads: int = 256) -> Any:
    """A tiled, software-pipelined GEMM. ``M`` may be ``T.dynamic``."""
    accum = "float32"

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            a_tile = T.alloc_shared((block_M, block_K), dtype)
            b_tile = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), accum)
            c_tile = T.alloc_shared((block_M, block_N), dtype)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], a_tile)
                T.copy(B[k * block_K, bx * block_N], b_tile)
                T.gemm(a_tile, b_tile, acc)
            T.copy(acc, c_tile)
            T.copy(c_tile, C[by * block_M, bx * block_N])

    return main


def matmul_fields(a: str, b: str, c: str, b_dims: tuple[str, str] = ("K", "N")) -> dict[str, Any]:
    """The contract of an fp16/bf16 matmul on Hopper (``gemm``, ``gemv.linear``): ``c`` [M, N] = ``a`` [M, K]
    times ``b`` of ``b_dims`` ([K, N]; ``F.linear``'s weight: [N, K]), priced by ``costs.gemm``."""
    return {"inputs": (TensorArg(a, ("M", "K")), TensorArg(b, b_dims)), "outputs": (TensorArg(c, ("M", "N")),),
            "cost": costs.gemm, "dtypes": ("float16", "bfloat16"), "targets": ("cuda-sm90a",)}


def gemm_reference(a: Any, b: Any) -> Any:
    """The PyTorch path: cuBLAS (or the CPU BLAS) in the input dtype."""
    return torch.matmul(a, b)


gemm = Operator(
    name="gemm",
    factory=matmul,
    reference=gemm_reference,
    **matmul_fields("A", "B", "C"),
    config={"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 3, "threads": 256},
    ranges=(
        DynamicRange("M", 1, 8192, {"N": 4096, "K": 4096}),
        DynamicRange("M", 1, 8192, {"N": 11008, "K": 4096}),
        DynamicRange("M", 1, 8192, {"N": 4096, "K": 11008}),
    ),
    shapes=({"M": 4096, "N": 4096, "K": 4096}, {"M": 8192, "N": 8192, "K": 8192}),
    tolerances={"float16": Tolerance(atol=2e-2, rtol=2e-2), "bfloat16": Tolerance(atol=6e-2, rtol=6e-2)},
)
