"""Operators that fail on purpose, for build isolation tests (CPU target)."""

import os
import signal
import time

import tilelang.language as T

from tileship.declare.spec import DynamicRange, Operator, TensorArg


def copy_kernel(N, dtype="float32", mode="ok"):
    if mode == "raise":
        raise ValueError("deliberate failure in the kernel factory")
    if mode == "hang":
        time.sleep(600)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i]

    return main


def copy_reference(a):
    return a.clone()


def _op(name, mode):
    return Operator(name=name, factory=copy_kernel, reference=copy_reference, inputs=(TensorArg("A", ("N",)),),
                    outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), config={"mode": mode},
                    ranges=(DynamicRange("N", 1, 1 << 20),))


good = _op("good", "ok")
boom = _op("boom", "raise")
hang = _op("hang", "hang")
crash = _op("crash", "crash")
