"""Eight candidates x two shapes of a "c"-target kernel: what ``benchmarks/build_speed.py --project``
compiles to show that a build with candidates scales with the cores (16 specializations)."""

from typing import Any

import tilelang.language as T
import torch

from tileship.declare.candidates import Space
from tileship.declare.spec import DynamicRange, Operator, TensorArg


def scaled_sum(N: Any, dtype: str = "float32", block: int = 256, rounds: int = 1) -> Any:
    """Y = X * 3 + 1, computed as ``rounds`` equal shares (more rounds: more work, same answer)."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block)) as bx:
            acc = T.alloc_local((1,), "float32")
            for i in T.serial(block):
                if bx * block + i < N:
                    acc[0] = 0.0
                    for _ in T.serial(rounds):
                        acc[0] = acc[0] + (X[bx * block + i] * 3.0 + 1.0) / rounds
                    Y[bx * block + i] = acc[0]

    return main


def scaled_sum_reference(x: Any) -> Any:
    return torch.add(torch.mul(x, 3.0), 1.0)


scaled = Operator(
    name="scaled",
    factory=scaled_sum,
    reference=scaled_sum_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    candidates=Space(rounds=[1, 2, 4, 8], block=[128, 256]),
    ranges=(DynamicRange("N", 1, 1 << 20),),
    shapes=({"N": 4096},),
)
