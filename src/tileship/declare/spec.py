"""Operator declarations: what a user writes next to an existing TileLang kernel factory.

An ``Operator`` names the factory (returns a ``T.prim_func``), the fixed config it is built
with, the PyTorch reference, which tensor dims are which, the accepted shapes (explicit
points and/or ``T.dynamic`` ranges), dtypes, tolerances and targets. Nothing here imports
TileLang or torch: declarations are checked, hashed and expanded into ``Specialization``
values without either.

Call convention: ``op(*inputs) -> output`` (or a tuple when several outputs). The factory's
prim_func takes ``inputs + outputs`` in declaration order, so ``out_idx`` is the tail.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.errors import DeclarationError

#: dtype names accepted in declarations (TileLang spelling == torch attribute name).
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int32")

#: defaults when an operator gives no tolerance for a dtype (compared to a float32/float64 reference).
DEFAULT_TOLERANCES: Mapping[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (3e-2, 3e-2),
    "float32": (1e-4, 1e-4),
    "float64": (1e-8, 1e-8),
    "int8": (0.0, 0.0),
    "int32": (0.0, 0.0),
}

_TARGET_RE = re.compile(r"^(c|cuda-sm(\d+)(a?))$")


@dataclass(frozen=True)
class Target:
    """A compile target by name: ``"c"`` (CPU) or ``"cuda-sm90a"`` style."""

    name: str

    def __post_init__(self) -> None:
        if not _TARGET_RE.match(self.name):
            raise DeclarationError(f"unknown target {self.name!r}", field="targets", hint='use "c" or "cuda-sm<NN>[a]", e.g. "cuda-sm90a"')

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
    """One tensor argument: its name and the dim names of its shape, e.g. ``TensorArg("A", ("M", "K"))``."""

    name: str
    dims: tuple[str, ...]


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


@dataclass(frozen=True)
class Operator:
    """A declared operator. Validate with ``check()`` (done by ``expand``)."""

    name: str
    factory: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    dtypes: tuple[str, ...]
    targets: tuple[str, ...]
    shapes: tuple[Mapping[str, int], ...] = ()
    ranges: tuple[DynamicRange, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    dtype_param: str = "dtype"
    #: dim name -> factory keyword (default: the dim name itself)
    params: Mapping[str, str] = field(default_factory=dict)
    #: TileLang pass configs the kernel is compiled with (part of the specialization's identity)
    pass_configs: Mapping[str, Any] = field(default_factory=dict)

    # -- derived -------------------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for arg in self.inputs + self.outputs:
            for d in arg.dims:
                seen.setdefault(d)
        return tuple(seen)

    @property
    def out_idx(self) -> list[int]:
        n = len(self.inputs)
        return list(range(n, n + len(self.outputs)))

    def tolerance(self, dtype: str) -> Tolerance:
        if dtype in self.tolerances:
            return self.tolerances[dtype]
        atol, rtol = DEFAULT_TOLERANCES[dtype]
        return Tolerance(atol, rtol)

    def check(self) -> None:
        """Raise DeclarationError naming the first bad field; return None when valid."""
        op = self.name or "<unnamed>"
        if not self.name or not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", self.name):
            raise DeclarationError("must be an identifier", operator=op, field="name")
        if not callable(self.factory):
            raise DeclarationError("factory is not callable", operator=op, field="factory")
        if self.reference is None or not callable(self.reference):
            raise DeclarationError("a PyTorch reference is required", operator=op, field="reference", hint="pass reference=fn computing the same result")
        if not self.inputs:
            raise DeclarationError("at least one input tensor is required", operator=op, field="inputs")
        if not self.outputs:
            raise DeclarationError("at least one output tensor is required", operator=op, field="outputs")
        names = [a.name for a in self.inputs + self.outputs]
        if len(set(names)) != len(names):
            raise DeclarationError(f"duplicate tensor names {names}", operator=op, field="inputs")
        in_dims = {d for a in self.inputs for d in a.dims}
        for a in self.outputs:
            for d in a.dims:
                if d not in in_dims:
                    raise DeclarationError(f"output {a.name} uses dim {d!r} that no input determines", operator=op, field=f"outputs.{a.name}")
        if not self.dtypes:
            raise DeclarationError("no dtypes declared", operator=op, field="dtypes")
        for dt in self.dtypes:
            if dt not in DTYPES:
                raise DeclarationError(f"unknown dtype {dt!r} (known: {', '.join(DTYPES)})", operator=op, field="dtypes")
        if not self.targets:
            raise DeclarationError("no targets declared", operator=op, field="targets")
        for t in self.targets:
            try:
                Target(t)
            except DeclarationError as exc:
                raise DeclarationError(exc.message, operator=op, field="targets", hint=exc.hint) from None
        if not self.shapes and not self.ranges:
            raise DeclarationError("the shape set is empty: declare shapes=[...] and/or ranges=[...]", operator=op, field="shapes")
        dims = set(self.dims)
        for i, shape in enumerate(self.shapes):
            for d, v in shape.items():
                if d not in dims:
                    raise DeclarationError(f"unknown dim {d!r} (dims: {', '.join(self.dims)})", operator=op, field=f"shapes[{i}].{d}")
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise DeclarationError(f"must be a positive int, got {v!r}", operator=op, field=f"shapes[{i}].{d}")
            missing = dims - set(shape)
            if missing:
                raise DeclarationError(f"missing dims {sorted(missing)}", operator=op, field=f"shapes[{i}]")
        for i, r in enumerate(self.ranges):
            f = f"ranges[{i}]"
            if r.dim not in dims:
                raise DeclarationError(f"unknown dim {r.dim!r} (dims: {', '.join(self.dims)})", operator=op, field=f"{f}.dim")
            if r.min < 1:
                raise DeclarationError(f"min must be >= 1, got {r.min}", operator=op, field=f"{f}.min")
            if r.min > r.max:
                raise DeclarationError(f"min {r.min} > max {r.max}", operator=op, field=f"{f}.min")
            for d in r.fixed:
                if d not in dims:
                    raise DeclarationError(f"unknown dim {d!r}", operator=op, field=f"{f}.fixed.{d}")
            missing = dims - set(r.fixed) - {r.dim}
            if missing:
                raise DeclarationError(f"fixed is missing dims {sorted(missing)}", operator=op, field=f"{f}.fixed")
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return
        accepts_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        wanted = [self.params.get(d, d) for d in self.dims] + [self.dtype_param, *self.config]
        for name in wanted:
            if name not in sig.parameters and not accepts_kw:
                fname = getattr(self.factory, "__name__", "?")
                field_name = f"config.{name}" if name in self.config else "params"
                raise DeclarationError(f"factory {fname}() has no parameter {name!r}", operator=op, field=field_name)
        for d, v in self.config.items():
            if not isinstance(v, (int, float, str, bool)):
                raise DeclarationError(f"config values must be int/float/str/bool, got {type(v).__name__}", operator=op, field=f"config.{d}")


@dataclass(frozen=True)
class Specialization:
    """One thing the build compiles: operator x dtype x shape (or dynamic range) x target.

    ``dims`` maps each dim to an int, or to ``(min, max)`` for the one ``T.dynamic`` dim.
    """

    op: str
    dtype: str
    dims: tuple[tuple[str, int | tuple[int, int]], ...]
    target: str

    @property
    def dynamic_dim(self) -> str | None:
        for d, v in self.dims:
            if isinstance(v, tuple):
                return d
        return None

    @property
    def shape_key(self) -> str:
        parts = []
        for d, v in self.dims:
            parts.append(f"{d}{v[0]}-{v[1]}" if isinstance(v, tuple) else f"{d}{v}")
        return "_".join(parts)

    @property
    def id(self) -> str:
        return f"{self.op}.{self.dtype}.{self.shape_key}.{self.target}"

    def dim_map(self) -> dict[str, int | tuple[int, int]]:
        return dict(self.dims)

    def to_json(self) -> dict[str, Any]:
        """JSON form; dims are an ordered list of [name, size | [min, max]] (files sort keys,
        and the dims' order is part of the id)."""
        return {"op": self.op, "dtype": self.dtype, "target": self.target,
                "dims": [[d, list(v) if isinstance(v, tuple) else v] for d, v in self.dims]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Specialization:
        raw = data["dims"]
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        dims = tuple((d, tuple(v) if isinstance(v, list) else int(v)) for d, v in pairs)
        return cls(op=data["op"], dtype=data["dtype"], dims=dims, target=data["target"])  # type: ignore[arg-type]


def expand(op: Operator, targets: tuple[str, ...] | None = None) -> list[Specialization]:
    """All specializations of ``op`` (for ``targets`` when given, intersected with the op's)."""
    op.check()
    chosen = [t for t in op.targets if targets is None or t in targets]
    out: list[Specialization] = []
    for target in chosen:
        for dtype in op.dtypes:
            for r in op.ranges:
                dm: dict[str, int | tuple[int, int]] = {**r.fixed, r.dim: (r.min, r.max)}
                out.append(Specialization(op.name, dtype, tuple((d, dm[d]) for d in op.dims), target))
            for shape in op.shapes:
                out.append(Specialization(op.name, dtype, tuple((d, shape[d]) for d in op.dims), target))
    return out


def describe(op: Operator) -> dict[str, Any]:
    """A JSON-able description of the declaration (for the lock; no callables)."""
    return {
        "inputs": [[a.name, list(a.dims)] for a in op.inputs],
        "outputs": [[a.name, list(a.dims)] for a in op.outputs],
        "dtypes": list(op.dtypes),
        "targets": list(op.targets),
        "shapes": [dict(sorted(s.items())) for s in op.shapes],
        "ranges": [{"dim": r.dim, "min": r.min, "max": r.max, "fixed": dict(sorted(r.fixed.items()))} for r in op.ranges],
        "config": dict(sorted(op.config.items())),
        "pass_configs": dict(sorted(op.pass_configs.items())),
        "tolerances": {dt: {"atol": op.tolerance(dt).atol, "rtol": op.tolerance(dt).rtol} for dt in op.dtypes},
        "factory": f"{getattr(op.factory, '__module__', '?')}.{getattr(op.factory, '__qualname__', '?')}",
        "reference": f"{getattr(op.reference, '__module__', '?')}.{getattr(op.reference, '__qualname__', '?')}",
        "fallback": "tested-reference",
    }
