"""Kernels a user writes for the CPU ("c") target, declared as the docs say, that no other test module has:
an output whose shape the kernel computes from a ``T.dynamic`` dim (``(rows, n_cols * 2)``) beside a
scalar argument, and a static shape the factory refuses inside a range that builds.
``tests/test_user_kernels.py`` builds, loads, calls and verifies them."""

import dataclasses

import tilelang.language as T
import torch
from declaring_kernels import row_sum, row_sum_ref  # noqa: F401 (row_sum_ref: the tests' reference of row_sum_small)

from tileship import DynamicRange, Operator, ScalarArg, TensorArg


def interleave_scaled(rows, n_cols, dtype="float32"):
    """y[r, 2j] = x[r, j], y[r, 2j + 1] = x[r, j] * s: the output is twice as wide as the input. Refuses a static
    ``n_cols`` that is not a multiple of 4 (as a tiled kernel asserts on its shapes): that specialization fails."""
    if isinstance(n_cols, int) and n_cols % 4:
        raise ValueError(f"a static n_cols must be a multiple of 4, got {n_cols}")

    @T.prim_func
    def main(x: T.Tensor((rows, n_cols), dtype), s: T.float32, y: T.Tensor((rows, n_cols * 2), dtype)):
        with T.Kernel(rows) as r:
            for j in T.serial(n_cols):
                y[r, 2 * j] = x[r, j]
                y[r, 2 * j + 1] = x[r, j] * T.cast(s, dtype)

    return main


def interleave_ref(x, s):
    return torch.stack([x, x * s], dim=-1).reshape(x.shape[0], -1)


interleave = Operator(
    name="interleave",
    factory=interleave_scaled,
    reference=interleave_ref,
    inputs=(TensorArg("x", ("rows", "n_cols")), ScalarArg("s", dtype="float32")),
    outputs=(TensorArg("y", ("rows", "n_cols*2")),),
    dtypes=("float32",),
    targets=("c",),
    ranges=(DynamicRange("n_cols", 1, 512, {"rows": 4}),),
    shapes=({"rows": 4, "n_cols": 6},),     # fails to build; the range covers it
)


def not_built(N, dtype="float32"):
    """A factory that builds nothing (every specialization fails): the reference serves each call."""
    raise NotImplementedError("no kernel yet")


def numpy_reference(a):
    """A reference that answers a NumPy array instead of a tensor (a user's mistake)."""
    return (a * 2).numpy()


numpy_answer = Operator(
    name="numpy_answer",
    factory=not_built,
    reference=numpy_reference,
    inputs=(TensorArg("a", ("N",)),),
    outputs=(TensorArg("b", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    shapes=({"N": 8},),
)


def float64_reference(a):
    """A reference that answers float64 where float32 is declared (a user's mistake)."""
    return a.double() * 2


def short_reference(a):
    """A reference that answers one element short of the declared shape (a user's mistake)."""
    return a[:-1] * 2


wrong_dtype = dataclasses.replace(numpy_answer, name="wrong_dtype", reference=float64_reference)
wrong_shape = dataclasses.replace(numpy_answer, name="wrong_shape", reference=short_reference)


def row_sum_small(M, N, dtype="float32"):
    """The guide's ``row_sum`` (``tests/declaring_kernels.py``: S = X.sum(1) into a ``T.empty`` output) as a plain
    factory that refuses a static N over 64 (a shape the kernel does not take). Not declared here:
    ``tests/test_user_kernels.py`` declares it without ``outputs=``."""
    if isinstance(N, int) and N > 64:
        raise ValueError(f"N={N} is over 64")
    return row_sum.get_tir(M, N, dtype)


# What the CPU "c" target cannot compile (``tileship.declare.c_target``): each such specialization fails alone,
# named with its reason, the others build and the reference serves its calls.
def doubled(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                C[i] = A[i] + A[i]

    return main


def doubled_ref(a):
    return a + a


def positive(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), P: T.Tensor((N,), "bool")):
        with T.Kernel(1):
            for i in T.serial(N):
                P[i] = A[i] > T.cast(0, dtype)

    return main


def positive_ref(a):
    return a > 0


def keyword_named(N, dtype="float32"):
    @T.prim_func
    def main(int: T.Tensor((N,), dtype), default: T.Tensor((N,), dtype)):  # noqa: A002 (the point of the test)
        with T.Kernel(1):
            for i in T.serial(N):
                default[i] = int[i] + int[i]

    return main


twice_bf16 = Operator(name="twice_bf16", factory=doubled, reference=doubled_ref, inputs=(TensorArg("A", ("N",)),),
                      outputs=(TensorArg("C", ("N",)),), dtypes=("float32", "bfloat16"), targets=("c",),
                      shapes=({"N": 8},))
is_positive = Operator(name="is_positive", factory=positive, reference=positive_ref, inputs=(TensorArg("A", ("N",)),),
                       outputs=(TensorArg("P", ("N",), dtype="bool"),), dtypes=("float32",), targets=("c",),
                       shapes=({"N": 8},))
keywords = Operator(name="keywords", factory=keyword_named, reference=doubled_ref,
                    inputs=(TensorArg("int", ("N",)),), outputs=(TensorArg("default", ("N",)),), dtypes=("float32",),
                    targets=("c",), shapes=({"N": 8},))
