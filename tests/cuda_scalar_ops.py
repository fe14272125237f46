"""A CUDA operator with scalar parameters and a dynamic dim (tests/test_artifact.py: the tvm-ffi ABI check at build)."""

import tilelang.language as T

from tileship.declare.spec import DynamicRange, Operator, ScalarArg, TensorArg


def scaled_kernel(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), s: T.float32, n: T.int32, B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < N:
                    B[bx * 128 + i] = A[bx * 128 + i] * s + T.cast(n, dtype)
    return main


scaled_cuda = Operator(
    name="scaled_cuda", factory=scaled_kernel,
    reference=lambda a, s, n: a * s + n,
    inputs=(TensorArg("A", ("N",)), ScalarArg("s", dtype="float32"), ScalarArg("n", dtype="int32")),
    outputs=(TensorArg("B", ("N",)),),
    dtypes=("float32",), targets=("cuda-sm90a",),
    shapes=({"N": 1000},), ranges=(DynamicRange("N", 1, 1 << 20),),
)
