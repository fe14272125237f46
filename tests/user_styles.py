"""Kernels written as TileLang's examples write them, in styles ``tests/user_ops.py`` does not have, for the CPU
("c") target: a lazy ``@tilelang.jit(out_idx=-1)`` declared without ``outputs=``, and parameters named like the
lower-case ``T.dynamic`` var of a declared range (a tensor ``k`` beside dim ``K``, a scalar ``n`` beside ``N``),
an in-place operator whose reference returns the tensor it updated, a factory whose dims are positional-only, and
eager ``@tilelang.jit`` kernels whose own ``T.dynamic`` var is named like one of their parameters.
``tests/test_user_styles.py`` builds, loads, calls and verifies them."""

import tilelang
import tilelang.language as T

from tileship import DynamicRange, Operator, ScalarArg, TensorArg


@tilelang.jit(out_idx=-1)
def negate(N, dtype="float32"):
    """B = -A; the decorator says B is the output, as upstream's lazy kernels do."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.Parallel(N):
                B[i] = -A[i]

    return main


def negate_ref(a):
    return -a


negated = Operator(name="negated", factory=negate, reference=negate_ref, inputs=(TensorArg("A", ("N",)),),
                   dtypes=("float32",), targets=("c",), shapes=({"N": 16},), ranges=(DynamicRange("N", 1, 64),))


def row_sum_k(M, K, dtype="float32"):
    """s[m] = k[m, :].sum(): the tensor is named ``k``, as the dim K's T.dynamic var is."""

    @T.prim_func
    def main(k: T.Tensor((M, K), dtype), s: T.Tensor((M,), dtype)):
        with T.Kernel(M) as m:
            acc = T.alloc_local((1,), dtype)
            acc[0] = 0.0
            for j in T.serial(K):
                acc[0] += k[m, j]
            s[m] = acc[0]

    return main


def row_sum_ref(k):
    return k.sum(-1)


row_sum_k_op = Operator(name="row_sum_k", factory=row_sum_k, reference=row_sum_ref,
                        inputs=(TensorArg("k", ("M", "K")),), outputs=(TensorArg("s", ("M",)),), dtypes=("float32",),
                        targets=("c",), ranges=(DynamicRange("K", 1, 64, {"M": 4}),))


def first_n(N, dtype="float32"):
    """Y = X with the elements from n on zeroed: the scalar is named ``n``, as the dim N's T.dynamic var is."""

    @T.prim_func
    def main(n: T.int32, X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                Y[i] = T.if_then_else(i < n, X[i], T.cast(0, dtype))

    return main


def first_n_ref(n, x):
    y = x.clone()
    y[n:] = 0
    return y


first_n_op = Operator(name="first_n", factory=first_n, reference=first_n_ref,
                      inputs=(ScalarArg("n", dtype="int32"), TensorArg("X", ("N",))), outputs=(TensorArg("Y", ("N",)),),
                      dtypes=("float32",), targets=("c",), ranges=(DynamicRange("N", 1, 64),))


def scale_inplace(N, dtype="float32"):
    """X *= s in place: no outputs."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), s: T.float32):
        with T.Kernel(1):
            for i in T.serial(N):
                X[i] = X[i] * T.cast(s, dtype)

    return main


def scale_inplace_ref(x, s):
    """Returns the tensor it updated, as torch's in-place methods do (a user's mistake: the doc says None)."""
    return x.mul_(s)


scaled_ = Operator(name="scaled_", factory=scale_inplace, reference=scale_inplace_ref,
                   inputs=(TensorArg("X", ("N",)), ScalarArg("s")), mutates=("X",), dtypes=("float32",),
                   targets=("c",), shapes=({"N": 8},))


def copy_rows(M, N, /, dtype="float32"):
    """B = A + 1, the dims positional-only (``/``), as a factory written for positional calls may take them."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as m:
            for j in T.serial(N):
                B[m, j] = A[m, j] + T.cast(1, dtype)

    return main


def plus_one(a):
    return a + 1


copied = Operator(name="copied", factory=copy_rows, reference=plus_one, inputs=(TensorArg("A", ("M", "N")),),
                  outputs=(TensorArg("B", ("M", "N")),), dtypes=("float32",), targets=("c",),
                  shapes=({"M": 4, "N": 8},), ranges=(DynamicRange("M", 1, 64, {"N": 8}),))


@tilelang.jit
def row_sum_eager(k, dtype):
    """s[m] = k[m, :].sum(), eager: the kernel's own ``T.dynamic("k")`` is named like its tensor parameter ``k``."""
    M = T.const("M")
    K = T.dynamic("k")
    k: T.Tensor((M, K), dtype)
    s = T.empty((M,), dtype)
    with T.Kernel(M) as m:
        acc = T.alloc_local((1,), dtype)
        acc[0] = 0.0
        for j in T.serial(K):
            acc[0] += k[m, j]
        s[m] = acc[0]
    return s


row_sum_eager_op = Operator(name="row_sum_eager", factory=row_sum_eager, reference=row_sum_ref,
                            inputs=(TensorArg("k", ("M", "K")),), dtypes=("float32",), targets=("c",),
                            shapes=({"M": 4, "K": 8},), ranges=(DynamicRange("K", 1, 64, {"M": 4}),))


@tilelang.jit
def first_n_eager(X, n, dtype):
    """Y = X with the elements from n on zeroed, eager: its own ``T.dynamic("n")`` is named like its scalar ``n``."""
    N = T.dynamic("n")
    X: T.Tensor((N,), dtype)
    n: T.int32
    Y = T.empty((N,), dtype)
    with T.Kernel(1):
        for i in T.serial(N):
            Y[i] = T.if_then_else(i < n, X[i], T.cast(0, dtype))
    return Y


def first_n_x_ref(x, n):
    return first_n_ref(n, x)


first_n_eager_op = Operator(name="first_n_eager", factory=first_n_eager, reference=first_n_x_ref,
                            inputs=(TensorArg("X", ("N",)), ScalarArg("n", dtype="int32")), dtypes=("float32",),
                            targets=("c",), shapes=({"N": 8},), ranges=(DynamicRange("N", 1, 64),))
