"""Kernels whose parameters disagree with their declarations, and one that agrees (``tests/test_contract.py``):
the build must refuse each of the first kind before compiling it, naming the argument."""

import tilelang.language as T

from tileship import Operator, TensorArg

C = {"dtypes": ("float32",), "targets": ("c",), "shapes": ({"N": 128},)}


def _copy(a):
    return a.clone()


def _sub(b, a):
    return a - b


def _sub_ab(a, b):
    return a - b


def k_inrank(N, dtype="float32"):
    """A is (N, 4) here; declared (N,): the launch path would read past the caller's tensor."""

    @T.prim_func
    def main(A: T.Tensor((N, 4), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                B[i] = A[i, 0]

    return main


def k_outshape(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N * 2,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N * 2):
                B[i] = A[i // 2]

    return main


def k_outdtype(N):
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float16")):
        with T.Kernel(1):
            for i in T.serial(N):
                B[i] = T.cast(A[i], "float16")

    return main


def k_sub(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C_: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                C_[i] = A[i] - B[i]

    return main


inrank = Operator(name="inrank", factory=k_inrank, reference=_copy, inputs=(TensorArg("A", ("N",)),),
                  outputs=(TensorArg("B", ("N",)),), **C)
outshape = Operator(name="outshape", factory=k_outshape, reference=_copy, inputs=(TensorArg("A", ("N",)),),
                    outputs=(TensorArg("B", ("N",)),), **C)
outdtype = Operator(name="outdtype", factory=k_outdtype, reference=_copy, params={"dtype": None},
                    inputs=(TensorArg("A", ("N",)),), outputs=(TensorArg("B", ("N",)),), **C)
swapped_in = Operator(name="swapped_in", factory=k_sub, reference=_sub,
                      inputs=(TensorArg("B", ("N",)), TensorArg("A", ("N",))), outputs=(TensorArg("C_", ("N",)),), **C)
sub = Operator(name="sub", factory=k_sub, reference=_sub_ab,
               inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))), outputs=(TensorArg("C_", ("N",)),), **C)
