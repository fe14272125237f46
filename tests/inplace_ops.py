"""An operator with an output AND an input it updates in place (``mutates``), for the CPU ("c") target:
the residual of a decoder layer, updated in place while the row sums are returned."""

import tilelang.language as T

from tileship.declare.spec import DynamicRange, Operator, TensorArg


def residual_add(M, N, dtype="float32"):
    """R += X row by row (in place); S[m] = the sum of the new row R[m]."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype), S: T.Tensor((M,), dtype)):
        with T.Kernel(M) as m:
            acc = T.alloc_local((1,), "float32")
            acc[0] = 0.0
            for n in T.serial(N):
                R[m, n] = R[m, n] + X[m, n]
                acc[0] += T.cast(R[m, n], "float32")
            S[m] = T.cast(acc[0], dtype)

    return main


def residual_add_reference(x, r):
    r.add_(x)
    return r.sum(dim=1)


residual_add_op = Operator(
    name="residual_add",
    factory=residual_add,
    reference=residual_add_reference,
    inputs=(TensorArg("X", ("M", "N")), TensorArg("R", ("M", "N"))),
    outputs=(TensorArg("S", ("M",)),),
    mutates=("R",),
    dtypes=("float32",),
    targets=("c",),
    ranges=(DynamicRange("M", 1, 64, {"N": 64}),),
    shapes=({"M": 4, "N": 32},),
)
