""""c"-target operators that update inputs in place, for the server's answer of them (``tests/test_serve_in_place.py``):
``clip_`` (``tests/foreign_audit_ops.py``: two inputs of two dtypes updated in place, two scalars, no outputs) and
``halve_``, which has an output and an input updated in place, the output's dim ``N/4`` (told only where 4 divides N:
elsewhere, a shape outside the declared set, the reference answers a size the server learns only after the call)."""

import tilelang.language as T
import torch
from foreign_audit_ops import clip_  # noqa: F401 (declared here too)

from tileship import Operator, TensorArg, Tolerance


def halve_sum(N, dtype="float32"):
    """S[g] = X[4g] + ... + X[4g+3], then X halved in place."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), S: T.Tensor((N // 4,), dtype)):
        with T.Kernel(1):
            for g in T.serial(N // 4):
                S[g] = X[g * 4] + X[g * 4 + 1] + X[g * 4 + 2] + X[g * 4 + 3]
            for i in T.serial(N):
                X[i] = X[i] * T.cast(0.5, dtype)

    return main


def halve_sum_ref(x):
    """The sums of groups of four (the last group zero-padded where 4 does not divide N), then x halved."""
    pad = torch.zeros((-x.shape[0]) % 4, dtype=x.dtype, device=x.device)
    s = torch.cat([x, pad]).reshape(-1, 4).sum(1)
    x.mul_(0.5)
    return s


halve_ = Operator(name="halve_", factory=halve_sum, reference=halve_sum_ref,
                  inputs=(TensorArg("X", ("N",)),), outputs=(TensorArg("S", ("N/4",)),), mutates=("X",),
                  dtypes=("float32",), targets=("c",), shapes=({"N": 8}, {"N": 16}),
                  tolerances={"float32": Tolerance(1e-6, 1e-6)})
