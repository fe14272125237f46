"""One operator per factory form, each declared with no wrapper (CPU "c" target)."""

import tilelang
import tilelang.language as T
import torch
from forms_helpers import scale_kernel
from tilelang.autotuner import autotune

from tileship.declare.spec import DynamicRange, Operator, TensorArg


@tilelang.jit(pass_configs={"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True})
def add_jit(N, dtype="float32", block=64):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block)) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


@autotune(configs=[{"block": 64}, {"block": 128}])
@tilelang.jit
def add_tuned(N, dtype="float32", block=64):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block)) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


@tilelang.jit
def add_eager(N, block=64):
    """Eager-style outputs: ``T.empty`` in the body, returned; the dtype is hard-coded."""

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        C = T.empty((N,), "float32")
        S = T.empty((N // 2,), "int32")
        with T.Kernel(T.ceildiv(N, block)) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]
        with T.Kernel(N // 2) as j:
            S[j] = j
        return C, S

    return main


def add_reference(a, b):
    return a + b


def add_eager_reference(a, b):
    return a + b, torch.arange(a.shape[0] // 2, dtype=torch.int32, device=a.device)


def scale_reference(a):
    return a * 2


_ab = (TensorArg("A", ("N",)), TensorArg("B", ("N",)))
_c = (TensorArg("C", ("N",)),)

jit_add = Operator(name="jit_add", factory=add_jit, reference=add_reference, inputs=_ab, outputs=_c,
                   dtypes=("float32",), targets=("c",), config={"block": 64}, shapes=({"N": 256},),
                   pass_configs={"tl.disable_warp_specialized": False})
tuned_add = Operator(name="tuned_add", factory=add_tuned, reference=add_reference, inputs=_ab, outputs=_c,
                     dtypes=("float32",), targets=("c",), config={"block": 128}, ranges=(DynamicRange("N", 1, 4096),))
eager_add = Operator(name="eager_add", factory=add_eager, reference=add_eager_reference, inputs=_ab,
                     dtypes=("float32",), targets=("c",), shapes=({"N": 128},), params={"dtype": None})
imported_scale = Operator(name="imported_scale", factory=scale_kernel, reference=scale_reference,
                          inputs=(TensorArg("A", ("N",)),), outputs=(TensorArg("B", ("N",)),), dtypes=("float32",),
                          targets=("c",), shapes=({"N": 100},), params={"dtype": "in_dtype"})
