"""Elementwise add on CUDA: the smallest kernel there is, for the launch-path measurements (issue 14).

``benchmarks/launch/tileship.toml`` builds it with the catalog RMSNorm; ``benchmarks/runtime_overhead.py``
then times, at N=1024, TileLang's adapter, the tileship kernel path and ``torch.add`` side by side.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.declare.spec import DynamicRange, Operator, TensorArg


def vector_add_cuda(N: Any, dtype: str = "float16", block: int = 1024, threads: int = 256) -> Any:
    """C = A + B, ``block`` elements per CTA; ``N`` may be ``T.dynamic``."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=threads) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


def add_reference(a: Any, b: Any) -> Any:
    """PyTorch's own op."""
    return torch.add(a, b)


add_cuda = Operator(
    name="add_cuda",
    factory=vector_add_cuda,
    reference=add_reference,
    cost=costs.add,
    inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))),
    outputs=(TensorArg("C", ("N",)),),
    dtypes=("float16", "float32"),
    targets=("cuda-sm90a",),
    ranges=(DynamicRange("N", 1, 1 << 26),),
)
