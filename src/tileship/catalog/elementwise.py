"""Elementwise add on CUDA: the smallest kernel there is, for the launch-path measurements (issue 14).

``benchmarks/launch/tileship.toml`` builds it with the catalog RMSNorm; ``benchmarks/runtime_overhead.py``
then times, at N=1024, TileLang's adapter, the tileship kernel path and ``torch.add`` side by side.
"""

import dataclasses

from tileship.catalog import cpu
from tileship.declare.spec import DynamicRange

#: the CPU catalog's ``add`` (kernel, contract, reference) on CUDA: 1024 elements a CTA of 256 threads
add_cuda = dataclasses.replace(
    cpu.add,
    name="add_cuda",
    dtypes=("float16", "float32"),
    targets=("cuda-sm90a",),
    config={"block": 1024, "threads": 256},
    ranges=(DynamicRange("N", 1, 1 << 26),),
    shapes=(),
    module=__name__,
)
