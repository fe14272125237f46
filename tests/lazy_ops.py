"""Operators for the "c" target whose module imports TileLang only inside the kernel factories:
a serving process that imports their references (and loads their artifacts) never imports TileLang."""

from typing import Any

from tileship.declare.spec import DynamicRange, Operator, ScalarArg, TensorArg


def scaled_add_kernel(N: Any, dtype: str = "float32") -> Any:
    """C = A + alpha * B, ``N`` dynamic, ``alpha`` a by-value scalar."""
    import tilelang.language as T  # the build imports TileLang; serving never calls the factory

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), alpha: T.float32, C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    C[bx * 64 + i] = A[bx * 64 + i] + alpha * B[bx * 64 + i]

    return main


def scaled_add_reference(a: Any, b: Any, alpha: float) -> Any:
    return a + alpha * b


scaled_add = Operator(
    name="scaled_add",
    factory=scaled_add_kernel,
    reference=scaled_add_reference,
    inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",)), ScalarArg("alpha", dtype="float32")),
    outputs=(TensorArg("C", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    ranges=(DynamicRange("N", 1, 1 << 20),),
)
