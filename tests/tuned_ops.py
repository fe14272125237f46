"""A "c"-target operator with candidates, for the Option B tests (build -> tune -> route).

``rounds`` repeats the per-element work (summing ``rounds`` equal shares of the result), so the
``rounds64`` candidate does ~64x the arithmetic of ``rounds1`` for the same answer: tuning must
never pick it. The reference is the same polynomial written as PyTorch ops over 512-element
chunks in a Python loop, a deliberately host-bound reference: it makes the kernel lose at small
sizes and win at large ones on any CPU, so the tests see both outcomes of the winner rule.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.declare.candidates import Space
from tileship.declare.spec import DynamicRange, Operator, TensorArg


def poly_kernel(N: Any, dtype: str = "float32", block: int = 256, rounds: int = 1, bias: float = 0.0) -> Any:
    """Y = ((((X * 0.5 + 1) * X - 2) * X + 0.25) * X + 3), one pass; ``rounds`` repeats it. A
    ``bias`` other than 0 makes it wrong (the candidate that verification must stop)."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block)) as bx:
            acc = T.alloc_local((1,), "float32")
            for i in T.serial(block):
                if bx * block + i < N:
                    acc[0] = 0.0
                    for _ in T.serial(rounds):
                        x = X[bx * block + i]
                        acc[0] = acc[0] + ((((x * 0.5 + 1.0) * x - 2.0) * x + 0.25) * x + 3.0) / rounds
                    Y[bx * block + i] = acc[0] + bias

    return main


def poly_reference(x: Any) -> Any:
    chunks = [(((c * 0.5 + 1.0) * c - 2.0) * c + 0.25) * c + 3.0 for c in torch.split(x, 512)]
    return torch.cat(chunks) if chunks else x.clone()


poly = Operator(
    name="poly",
    factory=poly_kernel,
    reference=poly_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    config={"block": 256},
    # rounds1 is fast; rounds64 does 64x the work; bias0p5 is as fast as rounds1 but wrong
    candidates=[*Space(rounds=[1, 64]).configs(), {"rounds": 1, "bias": 0.5}],
    ranges=(DynamicRange("N", 1, 1 << 16),),
    shapes=({"N": 65536},),
)
