"""Kernels for TileLang's ``"c"`` target: real TileLang code that runs on a CPU-only machine."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs, rmsnorm
from tileship.catalog.rmsnorm import EPS
from tileship.declare.spec import DynamicRange, Operator, TensorArg, Tolerance


def twin(op: Operator, name: str, factory: Callable[..., Any], shapes: tuple[Mapping[str, int], ...], *,
         module: str, tol: float | None = None, **changes: Any) -> Operator:
    """``op``'s ``"c"``-target twin, declared in ``module``: its contract, reference, sample hook and
    cost; ``factory``'s kernel, float32 only, static ``shapes`` only unless ``changes`` says otherwise,
    ``tol`` as both tolerances (None: the defaults)."""
    tolerances = {} if tol is None else {"float32": Tolerance(atol=tol, rtol=tol)}
    fields: dict[str, Any] = {"dtypes": ("float32",), "targets": ("c",), "ranges": (), "config": {},
                              "pass_configs": {}, "tolerances": tolerances, **changes}
    return dataclasses.replace(op, name=name, factory=factory, shapes=shapes, module=module, **fields)


def vector_add(N: Any, dtype: str = "float32", block: int = 256, threads: int | None = None) -> Any:
    """C = A + B, ``block`` elements a grid step; ``N`` may be ``T.dynamic``. ``threads``: a CTA's
    threads on CUDA (``elementwise.add_cuda``); None on the ``"c"`` target."""

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


def rms_norm_cpu(M: Any, N: int, dtype: str = "float32", eps: float = EPS) -> Any:
    """Row-wise RMSNorm with weight; one row per grid step, fp32 accumulation."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as row:
            acc = T.alloc_local((1,), "float32")
            acc[0] = 0.0
            for j in T.serial(N):
                acc[0] += T.cast(X[row, j], "float32") * T.cast(X[row, j], "float32")
            acc[0] = T.rsqrt(acc[0] / N + eps)
            for j in T.Parallel(N):
                Y[row, j] = T.cast(T.cast(X[row, j], "float32") * acc[0] * T.cast(W[j], "float32"), dtype)

    return main


add = Operator(
    name="add",
    factory=vector_add,
    reference=add_reference,
    cost=costs.add,
    inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))),
    outputs=(TensorArg("C", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    config={"block": 256},
    ranges=(DynamicRange("N", 1, 1 << 24),),
    shapes=({"N": 4096},),
)

rmsnorm_cpu = twin(rmsnorm.rmsnorm, "rmsnorm_cpu", rms_norm_cpu, ({"M": 64, "N": 256},), module=__name__,
                   config={"eps": EPS}, ranges=(DynamicRange("M", 1, 4096, {"N": 1024}),))
