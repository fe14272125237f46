"""The operator of the Option B loop on the CPU (``benchmarks/option_b_loop.py --device cpu``).

The poly kernel of ``tests/tuned_ops.py`` ("c" target) with two candidates, ``rounds1`` and
``rounds64`` (64x the arithmetic for the same answer), and a host-bound reference (PyTorch ops
over 512-element chunks in a Python loop). Declared with ONE static shape and no range: the
loop's served load is mostly at undeclared sizes, which the reference serves until ``tileship
propose`` turns the telemetry into a range and the promoted release covers them.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.declare.candidates import Space
from tileship.declare.spec import Operator, TensorArg


def poly_kernel(N: Any, dtype: str = "float32", block: int = 256, rounds: int = 1) -> Any:
    """Y = ((((X * 0.5 + 1) * X - 2) * X + 0.25) * X + 3); ``rounds`` repeats it in equal shares."""

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
                    Y[bx * block + i] = acc[0]

    return main


def poly_reference(x: Any) -> Any:
    chunks = [(((c * 0.5 + 1.0) * c - 2.0) * c + 0.25) * c + 3.0 for c in torch.split(x, 512)]
    return torch.cat(chunks) if chunks else x.clone()


loop_poly = Operator(
    name="loop_poly",
    factory=poly_kernel,
    reference=poly_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    config={"block": 256},
    candidates=Space(rounds=[1, 64]).configs(),
    shapes=({"N": 4096},),
)
