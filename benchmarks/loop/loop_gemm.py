"""The operator of the Option B loop on the GPU host (``benchmarks/option_b_loop.py --device cuda``).

The GEMM of ``tileship.catalog.gemm_tuned`` (its factory and reference, imported as a module so
that this module declares only one Operator) with two of its candidates, the catalog's 128x256
tile and the 64x64x128 small-M tile, float16 only, and ONE static shape (M=16, N=K=4096), no
range: the loop's load at other M is served by the reference until ``tileship propose`` turns
the telemetry into a range over M.
"""

from tileship.catalog import gemm_tuned as tuned
from tileship.declare.spec import Operator

gemm = Operator(
    name="gemm",
    factory=tuned.matmul_tuned,
    reference=tuned.base.gemm_reference,
    cost=tuned.costs.gemm,
    inputs=tuned.gemm_tuned.inputs,
    outputs=tuned.gemm_tuned.outputs,
    dtypes=("float16",),
    targets=("cuda-sm90a",),
    config={"block_K": 64, "split_k": 1},
    candidates=[
        {"block_M": 128, "block_N": 256, "num_stages": 3, "threads": 256},
        {"block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 4, "threads": 128},
    ],
    shapes=({"M": 16, "N": 4096, "K": 4096},),
    tolerances={"float16": tuned.gemm_tuned.tolerances["float16"]},
)
