"""Fault injection (a benchmark fixture, not in the wheel): a copy kernel with a deliberate
out-of-bounds write, for rehearsing a sticky CUDA error (``benchmarks/gpu_fault_recovery.py``;
``tests/test_faults.py``). An operator module named ``fault_kernel``: put ``benchmarks/`` on
``sys.path`` (``Project(root=...)`` does it for a build) to build or load it.

``fault_copy(X)`` returns a copy of ``X``, except when ``X[0] == POISON``: then every thread
writes ``OFFSET`` elements past the end of ``Y`` instead (about 4 GiB beyond the buffer),
which on a GPU is an illegal address (a sticky error: the process's CUDA context is lost)
and on the CPU (``"c"`` target) a segmentation fault. TileLang's safe-memory legalization
is switched off for this kernel only, so the out-of-bounds store is not guarded away.
"""

from typing import Any

import tilelang.language as T

from tileship.declare.spec import DynamicRange, Operator, TensorArg

POISON = -12345.0
OFFSET = 1 << 30


def oob_copy(N: Any, dtype: str = "float32", block: int = 256, offset: int = OFFSET, poison: float = POISON) -> Any:
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    if X[0] == T.cast(poison, dtype):
                        Y[bx * block + i + offset] = X[bx * block + i]  # deliberate: out of bounds
                    else:
                        Y[bx * block + i] = X[bx * block + i]

    return main


def copy_reference(x: Any) -> Any:
    return x.clone()


fault_copy = Operator(
    name="fault_copy",
    factory=oob_copy,
    reference=copy_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("cuda-sm90a", "c"),
    config={"block": 256, "offset": OFFSET, "poison": POISON},
    ranges=(DynamicRange("N", 1, 1 << 20),),
    pass_configs={"tl.disable_safe_memory_legalize": True},
)
