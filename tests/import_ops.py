"""Operator modules that misbehave at import (probe ``foreign_kernels_round16``, F8, F9); ``tests/test_import_ops.py``.

``import_compile_ops`` compiles a kernel when imported; ``import_data_ops`` reads a data file next to it.
Each is written into a temporary project by the test (the first would compile in every process importing it)."""

COMPILE = '''
import tilelang
import tilelang.language as T

from tileship import Operator, TensorArg


def k(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.Parallel(N):
                B[i] = A[i] * 2

    return main


def ref(a):
    return a * 2


_warm = tilelang.compile(k(16), target="c")  # the mistake: a compile at import time

double = Operator(name="double", factory=k, reference=ref, inputs=(TensorArg("A", ("N",)),),
                  outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 64},))
'''

DATA = '''
import json
from pathlib import Path

import tilelang.language as T

from tileship import Operator, TensorArg

SCALE = json.loads((Path(__file__).parent / "scale.json").read_text())["scale"]  # not a .py: not shipped


def k(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.Parallel(N):
                B[i] = A[i] * SCALE

    return main


def ref(a):
    return a * SCALE


scaled = Operator(name="scaled", factory=k, reference=ref, inputs=(TensorArg("A", ("N",)),),
                  outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 64},))
'''
