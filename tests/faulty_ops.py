"""Deliberately wrong "c"-target kernels: what ``tileship verify`` must catch.

- ``wrong_add``: every 97th element computes A - B instead of A + B (a wrong value).
- ``tail_add``: launches N // block blocks, forgetting the tail: correct when N is a multiple
  of the block, leaves the last N % block elements unwritten otherwise (caught by the poison).
- ``nan_add``: returns NaN wherever A > 3 (about 0.13% of normal samples).
"""

from typing import Any

import tilelang.language as T

from tileship.declare.spec import DynamicRange, Operator, TensorArg

BLOCK = 256
WRONG_EVERY = 97


def wrong_kernel(N: Any, dtype: str = "float32") -> Any:
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK)) as bx:
            for i in T.Parallel(BLOCK):
                idx = bx * BLOCK + i
                if idx < N:
                    C[idx] = T.if_then_else(idx % WRONG_EVERY == 0, A[idx] - B[idx], A[idx] + B[idx])

    return main


def tail_kernel(N: Any, dtype: str = "float32", block: int = BLOCK) -> Any:
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(N // block) as bx:  # the bug: floor instead of ceildiv
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


def nan_kernel(N: Any, dtype: str = "float32") -> Any:
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK)) as bx:
            for i in T.Parallel(BLOCK):
                idx = bx * BLOCK + i
                if idx < N:
                    C[idx] = T.if_then_else(A[idx] > 3.0, T.sqrt(0.0 - A[idx]), A[idx] + B[idx])

    return main


def add_reference(a: Any, b: Any) -> Any:
    import torch

    return torch.add(a, b)


def _op(name: str, factory: Any, *, ranges: tuple[DynamicRange, ...] = (),
        config: dict[str, Any] | None = None) -> Operator:
    return Operator(name=name, factory=factory, reference=add_reference,
                    inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))), outputs=(TensorArg("C", ("N",)),),
                    dtypes=("float32",), targets=("c",), shapes=({"N": 4096},), ranges=ranges,
                    config=config or {})


wrong_add = _op("wrong_add", wrong_kernel)
tail_add = _op("tail_add", tail_kernel, ranges=(DynamicRange("N", 1, 65536),), config={"block": BLOCK})
nan_add = _op("nan_add", nan_kernel)
