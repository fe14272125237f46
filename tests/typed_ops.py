"""Operators with per-tensor dtypes and derived dims, for the CPU ("c") target."""

import tilelang.language as T
import torch

from tileship.declare.spec import Operator, ScalarArg, TensorArg, Tolerance


def qadd_kernel(N, dtype="float32"):
    """C = A + the i-th 4-bit value packed in Q (eight per int32); Z = Q + 1."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), Q: T.Tensor((N // 8,), "int32"), C: T.Tensor((N,), dtype),
             Z: T.Tensor((N // 8,), "int32")):
        with T.Kernel(N // 8) as bx:
            for i in T.serial(8):  # the C target cannot vectorize the shift
                C[bx * 8 + i] = A[bx * 8 + i] + T.cast((Q[bx] >> (4 * i)) & 15, dtype)
            Z[bx] = Q[bx] + 1

    return main


def qadd_reference(a, q):
    shifts = torch.arange(8, dtype=torch.int32, device=q.device) * 4
    nib = ((q.unsqueeze(-1) >> shifts) & 15).reshape(-1)
    return a + nib.to(a.dtype), q + 1


def qadd_sample(dims, dtype, device):
    a = torch.randn(dims["N"], device=device).to(getattr(torch, dtype))
    q = torch.randint(0, 1 << 30, (dims["N"] // 8,), dtype=torch.int32, device=device)
    return a, q


qadd = Operator(
    name="qadd",
    factory=qadd_kernel,
    reference=qadd_reference,
    inputs=(TensorArg("A", ("N",)), TensorArg("Q", ("N/8",), dtype="int32")),
    outputs=(TensorArg("C", ("N",)), TensorArg("Z", ("N/8",), dtype="int32")),
    dtypes=("float32", "float64"),
    targets=("c",),
    shapes=({"N": 64}, {"N": 256}),
    sample=qadd_sample,
)


def masked_rows_kernel(M, N, dtype="float64"):
    """Y = X where the row's mask is set, else 0; mean = the float32 mean of each row of X."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), mask: T.Tensor((M,), "uint8"), Y: T.Tensor((M, N), dtype),
             mean: T.Tensor((M,), "float32")):
        with T.Kernel(M) as row:
            acc = T.alloc_local((1,), "float32")
            acc[0] = 0.0
            for j in T.serial(N):
                acc[0] += T.cast(X[row, j], "float32")
            mean[row] = acc[0] / N
            for j in T.Parallel(N):
                Y[row, j] = T.if_then_else(mask[row] != T.uint8(0), X[row, j], T.cast(0, dtype))

    return main


def masked_rows_reference(x, mask):
    y = torch.where(mask.bool().unsqueeze(-1), x, torch.zeros_like(x))
    return y, x.mean(dim=-1).to(torch.float32)


masked_rows = Operator(
    name="masked_rows",
    factory=masked_rows_kernel,
    reference=masked_rows_reference,
    inputs=(TensorArg("X", ("M", "N")), TensorArg("mask", ("M",), dtype="uint8")),
    outputs=(TensorArg("Y", ("M", "N")), TensorArg("mean", ("M",), dtype="float32")),
    dtypes=("float64",),
    targets=("c",),
    shapes=({"M": 8, "N": 32},),
    tolerances={"float64": Tolerance(1e-9, 1e-9), "mean": Tolerance(1e-5, 1e-5)},
)


def scaled_add_kernel(N, dtype="float32"):
    """B = A * s + n with s, n passed by value."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), s: T.float32, n: T.int32, B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i] * s + T.cast(n, dtype)

    return main


def scaled_add_reference(a, s, n):
    return a * s + n


scaled_add = Operator(
    name="scaled_add",
    factory=scaled_add_kernel,
    reference=scaled_add_reference,
    inputs=(TensorArg("A", ("N",)), ScalarArg("s", dtype="float32"), ScalarArg("n", dtype="int32")),
    outputs=(TensorArg("B", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    shapes=({"N": 128},),
)
