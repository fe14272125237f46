"""A kernel factory that lives in another module than the operator declaring it."""

import tilelang.language as T


def scale_kernel(N, in_dtype="float32", factor=2):
    @T.prim_func
    def main(A: T.Tensor((N,), in_dtype), B: T.Tensor((N,), in_dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i] * factor

    return main
