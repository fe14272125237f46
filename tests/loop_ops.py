"""The operator of the Option B loop on the CPU (``benchmarks/option_b_loop.py --device cpu``).

The poly kernel and reference of ``tests/tuned_ops.py`` (imported from it) ("c" target) with two candidates,
``rounds1`` and ``rounds64`` (64x the arithmetic for the same answer), and a host-bound reference (PyTorch ops
over 512-element chunks in a Python loop). Declared with ONE static shape and no range: the
loop's served load is mostly at undeclared sizes, which the reference serves until ``tileship
propose`` turns the telemetry into a range and the promoted release covers them.
"""

from tuned_ops import poly_kernel, poly_reference

from tileship.declare.candidates import Space
from tileship.declare.spec import Operator, TensorArg

loop_poly = Operator(
    name="loop_poly",
    factory=poly_kernel,
    reference=poly_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    config={"block": 256},
    candidates=Space(rounds=[1, 64]).configs(),
    shapes=({"N": 4096},),
)
