"""Small foreign "c"-target operators for ``tests/test_foreign_calls.py``: two outputs, by-value scalars (a bool
among them), an int32 input with an output of the operator dtype, an input updated in place with no outputs, and
two outputs with scalars (TileLang's adapter serves them) whose reference returns a list, and an int32 operator with
a scalar of the operator dtype ("same")."""

import tilelang.language as T
import torch

from tileship import DynamicRange, Operator, ScalarArg, TensorArg


def sum_prod_kernel(N, dtype="float32"):
    """S = A + B, P = A * B."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), S: T.Tensor((N,), dtype), P: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 16)) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    S[bx * 16 + i] = A[bx * 16 + i] + B[bx * 16 + i]
                    P[bx * 16 + i] = A[bx * 16 + i] * B[bx * 16 + i]

    return main


def sum_prod_ref(a, b):
    return a + b, a * b


sum_prod = Operator(name="sum_prod", factory=sum_prod_kernel, reference=sum_prod_ref,
                    inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))),
                    outputs=(TensorArg("S", ("N",)), TensorArg("P", ("N",))),
                    dtypes=("float32",), targets=("c",), shapes=({"N": 64},), ranges=(DynamicRange("N", 1, 1024),))


def scale_kernel(N, dtype="float32"):
    """B = A * s where flag, else A."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), s: T.float32, flag: T.bool, B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 16)) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    B[bx * 16 + i] = T.if_then_else(flag, A[bx * 16 + i] * T.cast(s, dtype), A[bx * 16 + i])

    return main


def scale_ref(a, s, flag):
    return a * s if flag else a.clone()


scale = Operator(name="scale", factory=scale_kernel, reference=scale_ref,
                 inputs=(TensorArg("A", ("N",)), ScalarArg("s", dtype="float32"), ScalarArg("flag", dtype="bool")),
                 outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 32},))


def half_kernel(N, dtype="float32"):
    """Y = X / 2 for an int32 X, in the operator dtype."""

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Y: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                Y[i] = T.cast(X[i], dtype) * T.cast(0.5, dtype)

    return main


def half_ref(x):
    return x.to(torch.float64) * 0.5


half = Operator(name="half", factory=half_kernel, reference=half_ref, inputs=(TensorArg("X", ("N",), dtype="int32"),),
                outputs=(TensorArg("Y", ("N",)),), dtypes=("float64",), targets=("c",), shapes=({"N": 48},))


def bump_kernel(N, dtype="float32"):
    """Acc += X, in place; no outputs."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Acc: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 16)) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    Acc[bx * 16 + i] = Acc[bx * 16 + i] + X[bx * 16 + i]

    return main


def bump_ref(x, acc):
    acc.add_(x)


bump = Operator(name="bump", factory=bump_kernel, reference=bump_ref,
                inputs=(TensorArg("X", ("N",)), TensorArg("Acc", ("N",))), mutates=("Acc",),
                dtypes=("float32",), targets=("c",), shapes=({"N": 64},))


def mul_add_kernel(N, dtype="float32"):
    """M = A * s, P = A + n, for a float32 s and an int32 n."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), s: T.float32, n: T.int32, M: T.Tensor((N,), dtype),
             P: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 16)) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    M[bx * 16 + i] = A[bx * 16 + i] * T.cast(s, dtype)
                    P[bx * 16 + i] = A[bx * 16 + i] + T.cast(n, dtype)

    return main


def mul_add_ref(a, s, n):
    return [a * s, a + n]  # a list, as foreign code may return several outputs


mul_add = Operator(name="mul_add", factory=mul_add_kernel, reference=mul_add_ref,
                   inputs=(TensorArg("A", ("N",)), ScalarArg("s", dtype="float32"), ScalarArg("n", dtype="int32")),
                   outputs=(TensorArg("M", ("N",)), TensorArg("P", ("N",))), dtypes=("float32",), targets=("c",),
                   shapes=({"N": 32},))


def shift_kernel(N, dtype="int32"):
    """Y = X + k, k a scalar of the operator dtype (int32 here)."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), k: T.int32, Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 16)) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    Y[bx * 16 + i] = X[bx * 16 + i] + k

    return main


def shift_ref(x, k):
    return x + k


shift = Operator(name="shift", factory=shift_kernel, reference=shift_ref,
                 inputs=(TensorArg("X", ("N",)), ScalarArg("k", dtype="same")), outputs=(TensorArg("Y", ("N",)),),
                 dtypes=("int32",), targets=("c",), shapes=({"N": 32},))
