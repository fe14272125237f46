"""Declaration parts: dtypes, targets, tensor and scalar arguments, dynamic ranges, tolerances.

The values an Operator is declared from, each checked on its own; spec.Operator
checks how they fit together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import SAME
from tileship.errors import DeclarationError

#: dtype names accepted in declarations (TileLang spelling == torch attribute name); the 8-bit floats are a
#: quantizing kernel's outputs (``T.float8_e4m3fn``), compared in float64
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
          "float8_e4m3fn", "float8_e5m2")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: defaults when an operator gives no tolerance for a dtype (compared to a float32/float64 reference).
DEFAULT_TOLERANCES: Mapping[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (3e-2, 3e-2),
    "float32": (1e-4, 1e-4),
    "float64": (1e-8, 1e-8),
    "int8": (0.0, 0.0),
    "int16": (0.0, 0.0),
    "int32": (0.0, 0.0),
    "int64": (0.0, 0.0),
    "uint8": (0.0, 0.0),
    "bool": (0.0, 0.0),
    # one step of the 3- and 2-bit mantissas (a scale rounded differently moves a value by one), the smallest
    # subnormal absolute
    "float8_e4m3fn": (2.0**-9, 2.0**-3),
    "float8_e5m2": (2.0**-16, 2.0**-2),
}

_TARGET_RE = re.compile(r"^(c|cuda-sm(\d+)(a?))$")


@dataclass(frozen=True)
class Target:
    """A compile target by name: ``"c"`` (CPU) or ``"cuda-sm90a"`` style."""

    name: str

    def __post_init__(self) -> None:
        if not _TARGET_RE.match(self.name):
            raise DeclarationError(f"unknown target {self.name!r}", field="targets",
                                   hint='use "c" or "cuda-sm<NN>[a]", e.g. "cuda-sm90a"')

    @property
    def device_type(self) -> str:
        """The torch device type whose tensors this target serves."""
        return "cpu" if self.name == "c" else "cuda"

    @property
    def arch(self) -> str | None:
        """``sm_90a`` for ``cuda-sm90a``; None for CPU."""
        m = _TARGET_RE.match(self.name)
        assert m is not None
        return None if m.group(1) == "c" else f"sm_{m.group(2)}{m.group(3)}"

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(9, 0) for sm_90a; None for CPU."""
        m = _TARGET_RE.match(self.name)
        assert m is not None
        if m.group(1) == "c":
            return None
        digits = m.group(2)
        return int(digits[:-1]), int(digits[-1])

    def tilelang(self) -> Any:
        """The target as TileLang wants it: a dict for CUDA (never the string form)."""
        return "c" if self.name == "c" else {"kind": "cuda", "arch": self.arch}


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument: its name, its dims and its dtype.

    ``TensorArg("A", ("M", "K"))`` has the operator's dtype; ``TensorArg("qweight", ("N", "K/8"),
    dtype="int32")`` packs eight int4 values per int32 along a ``K`` that the factory receives;
    ``TensorArg("topk_idx", ("M", 6), dtype="int32")`` has six columns at every shape.
    """

    name: str
    dims: tuple[str, ...]
    #: "same" (the operator dtype of the specialization) or a literal dtype name (DTYPES)
    dtype: str = SAME

    def __post_init__(self) -> None:
        if isinstance(self.dims, list):  # dims=["N"] is dims=("N",)
            object.__setattr__(self, "dims", tuple(self.dims))
        if isinstance(self.dims, tuple) and any(type(d) is int for d in self.dims):  # ("M", 6) is ("M", "6")
            object.__setattr__(self, "dims", tuple(str(d) if type(d) is int else d for d in self.dims))

    def dtype_for(self, op_dtype: str) -> str:
        return op_dtype if self.dtype == SAME else self.dtype


@dataclass(frozen=True)
class ScalarArg:
    """A non-tensor input the kernel takes by value (a softmax scale, a length), e.g.
    ``ScalarArg("scale", dtype="float32")``: passed as a Python number, never part of the
    dispatch key (one specialization serves every value)."""

    name: str
    #: a literal scalar dtype (float32, int32, bool, ...) or "same"
    dtype: str = "float32"

    @property
    def dims(self) -> tuple[str, ...]:
        return ()

    def dtype_for(self, op_dtype: str) -> str:
        return op_dtype if self.dtype == SAME else self.dtype


@dataclass(frozen=True)
class DynamicRange:
    """One ``T.dynamic`` kernel serving ``dim`` in ``[min, max]`` with the other dims fixed."""

    dim: str
    min: int
    max: int
    fixed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
