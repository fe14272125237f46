"""One catalog CUDA kernel (the RMSNorm, fp16, one static shape): the smallest real nvcc compile,
built by tests/test_toolchain.py with the toolchain's wheel nvcc."""

from __future__ import annotations

from tileship import Operator, TensorArg
from tileship.catalog.rmsnorm import EPS, rms_norm, rms_norm_reference

rmsnorm = Operator(
    name="rmsnorm",
    factory=rms_norm,
    reference=rms_norm_reference,
    inputs=(TensorArg("X", ("M", "N")), TensorArg("W", ("N",))),
    outputs=(TensorArg("Y", ("M", "N")),),
    dtypes=("float16",),
    targets=("cuda-sm90a",),
    config={"threads": 128, "eps": EPS},
    shapes=({"M": 256, "N": 4096},),
    pass_configs={"tl.disable_tma_lower": True},
)
