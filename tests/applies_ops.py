"""A "c"-target operator whose candidates apply to some shapes only (``Operator.applies``), for
``tests/test_candidate_applies.py``: the polynomial of ``tuned_ops`` at two static sizes; ``block128``
is built at N=65536 only, ``rounds64`` (64x the work, never the winner) at both."""

from typing import Any

from tuned_ops import poly_kernel, poly_reference

from tileship.declare.spec import Operator, TensorArg


def poly_applies(config: Any, dims: Any) -> bool:
    """The 128-wide block only at N=65536; every other candidate everywhere."""
    return config["block"] != 128 or dims["N"] == 65536


poly_some = Operator(
    name="poly_some",
    factory=poly_kernel,
    reference=poly_reference,
    inputs=(TensorArg("X", ("N",)),),
    outputs=(TensorArg("Y", ("N",)),),
    dtypes=("float32",),
    targets=("c",),
    config={"block": 256},
    candidates=[{"rounds": 1}, {"rounds": 64}, {"rounds": 1, "block": 128}],
    applies=poly_applies,
    shapes=({"N": 4096}, {"N": 65536}),
)
