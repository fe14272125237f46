"""Operator declarations: what a user writes next to an existing TileLang kernel factory.

An ``Operator`` names the factory (returns a ``T.prim_func``), the fixed config it is built
with, the PyTorch reference, which tensor dims are which, the accepted shapes (explicit
points and/or ``T.dynamic`` ranges), dtypes, tolerances and targets. Nothing here imports
TileLang or torch: declarations are checked, hashed and expanded into ``Specialization``
values without either.

Call convention: ``op(*inputs) -> output`` (or a tuple when several outputs). The factory's
prim_func takes ``inputs + outputs`` in declaration order, so ``out_idx`` is the tail.

Each tensor has its own dtype (``"same"``: the operator dtype of the specialization, or a
literal such as ``"int32"``) and its dims may be derived from a base dim (``"K/8"``); see
``tileship.declare.dims``. Only base dims are factory parameters and specialization dims.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import SAME, DimExpr, shape_at
from tileship.declare.parts import (  # noqa: F401 (re-exported)
    DEFAULT_TOLERANCES,
    DTYPES,
    FLOAT_DTYPES,
    DynamicRange,
    ScalarArg,
    Target,
    TensorArg,
    Tolerance,
)
from tileship.declare.specialization import Specialization, tensor_dtypes, tensor_tolerance  # noqa: F401 (re-exported)
from tileship.errors import DeclarationError

#: ``sample(dims, dtype, device) -> tuple of input tensors``: valid inputs for the base ``dims``
Sampler = Callable[[dict[str, int], str, Any], tuple[Any, ...]]


@dataclass(frozen=True, kw_only=True)
class Operator:
    """A declared operator. Validate with ``check()`` (done by ``expand``).

    ``tolerances`` maps an operator dtype to its Tolerance and, optionally, an output name to a
    Tolerance that overrides it for that output (e.g. a float32 ``mean`` beside a bf16 ``y``).
    ``sample`` produces valid inputs for verify/demo/benchmarks when random ones are not
    (lengths within bounds, packed weights); without it floats are standard normal, ints small
    random ints and bool/uint8 random 0/1.
    """

    name: str
    factory: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: tuple[TensorArg | ScalarArg, ...]
    dtypes: tuple[str, ...]
    targets: tuple[str, ...]
    #: the trailing prim_func parameters; omit for kernels that allocate outputs with ``T.empty``
    #: (then they are read from the traced kernel: ``tileship.declare.outputs``)
    outputs: tuple[TensorArg, ...] = ()
    shapes: tuple[Mapping[str, int], ...] = ()
    ranges: tuple[DynamicRange, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    dtype_param: str = "dtype"
    #: declared name (a dim, or "dtype") -> factory keyword (default: the name itself);
    #: ``{"dtype": None}`` passes no dtype (a factory that hard-codes its dtypes)
    params: Mapping[str, str | None] = field(default_factory=dict)
    #: TileLang pass configs the kernel is compiled with (part of the specialization's identity)
    pass_configs: Mapping[str, Any] = field(default_factory=dict)
    #: optional input generator (see the class docstring)
    sample: Sampler | None = None
    #: optional work model ``cost(dims, dtype) -> (flops, bytes)`` of one call: verify puts each timed
    #: shape on the roofline of the device it runs on (``tileship.verify.roofline``)
    cost: Callable[[Mapping[str, int], str], tuple[float, float]] | None = None
    #: Option B: candidate configs, each laid over ``config`` and built as its own artifact for every
    #: shape: a list of dicts, a ``Space(...)``, or ``"factory"`` (the factory's ``@autotune`` configs).
    #: ``tileship tune`` picks the winner per shape bucket on the target GPU (``tileship.declare.candidates``)
    candidates: Any = ()
    #: the module declaring this operator, where build workers look it up (default: the module
    #: the ``Operator(...)`` call runs in; ``load_operators`` sets the one it found it in)
    module: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.module is None:
            caller = sys._getframe(2).f_globals.get("__name__")  # 0: here, 1: __init__, 2: the declaring module
            object.__setattr__(self, "module", caller)

    def compile_pass_configs(self) -> dict[str, Any]:
        """The pass configs the kernel is compiled with: the ``@tilelang.jit(pass_configs=...)`` of the
        factory, overridden key by key by ``Operator.pass_configs`` (``describe`` lists the overrides)."""
        from tileship.declare.factory import resolve

        return {**resolve(self.factory, operator=self.name).decorator_pass_configs, **self.pass_configs}

    def factory_param(self, name: str) -> str | None:
        """The factory keyword receiving the declared ``name`` (a dim or "dtype"); None: not passed."""
        if name in self.params:
            return self.params[name]
        return self.dtype_param if name == "dtype" else name

    # -- derived -------------------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        """The base dims, in order of first appearance (derived dims contribute their base)."""
        seen: dict[str, None] = {}
        for arg in self.inputs + self.outputs:
            for d in arg.dims:
                try:
                    seen.setdefault(DimExpr.parse(d).base)
                except ValueError:
                    seen.setdefault(d)
        return tuple(seen)

    @property
    def out_idx(self) -> list[int]:
        n = len(self.inputs)
        return list(range(n, n + len(self.outputs)))

    def tolerance(self, dtype: str, output: str | None = None) -> Tolerance:
        """The tolerance of ``output`` (when given and overridden by name), else of ``dtype``."""
        if output is not None and output in self.tolerances and output not in DTYPES:
            return self.tolerances[output]
        if dtype in self.tolerances:
            return self.tolerances[dtype]
        atol, rtol = DEFAULT_TOLERANCES[dtype]
        return Tolerance(atol, rtol)

    def _check_tensors(self, op: str) -> None:
        in_dims: set[str] = set()
        for group, args in (("inputs", self.inputs), ("outputs", self.outputs)):
            for a in args:
                if isinstance(a, ScalarArg) and group == "outputs":
                    raise DeclarationError(f"{a.name} is a ScalarArg: a kernel writes tensors, not scalars", operator=op, field=f"outputs.{a.name}",
                                           hint=f'declare it as a tensor with a declared dim, e.g. TensorArg("{a.name}", ("M",))')
                if not isinstance(a, (TensorArg, ScalarArg)):
                    raise DeclarationError(f"must be a TensorArg or ScalarArg, got {type(a).__name__}", operator=op, field=group)
                f = f"{group}.{a.name}"
                if isinstance(a.dims, str):
                    raise DeclarationError(f"dims must be a tuple of names, got the string {a.dims!r}", operator=op, field=f"{f}.dims",
                                           hint=f'write dims=("{a.dims}",) (note the comma)')
                if a.dtype != SAME and a.dtype not in DTYPES:
                    raise DeclarationError(f"unknown dtype {a.dtype!r} (known: same, {', '.join(DTYPES)})", operator=op, field=f"{f}.dtype",
                                           hint='write "same" for the operator dtype, or one of the names listed')
                for d in a.dims:
                    try:
                        e = DimExpr.parse(d)
                    except ValueError as exc:
                        raise DeclarationError(str(exc), operator=op, field=f"{f}.dims",
                                               hint='write a dim name ("K") or <dim>/<int>, <dim>//<int>, <dim>*<int> ("K/8")') from None
                    if group == "inputs":
                        in_dims.add(e.base)
                    elif e.base not in in_dims:
                        raise DeclarationError(f"output {a.name} uses dim {e.base!r} that no input determines", operator=op, field=f)

    def _check_exact(self, op: str, sizes: Mapping[str, int], where: str) -> None:
        for a in self.inputs + self.outputs:
            try:
                shape_at([d for d in a.dims if DimExpr.parse(d).base in sizes], sizes)
            except ValueError as exc:
                base = str(exc).split("=", 1)[0]
                raise DeclarationError(f"{exc} of {a.name}: that shape is not one the declaration covers", operator=op,
                                       field=f"{where}.{base}", hint=f"use a {base} that divides") from None

    def check(self) -> None:
        """Raise DeclarationError naming the first bad field; return None when valid."""
        op = self.name or "<unnamed>"
        if not self.name or not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", self.name):
            raise DeclarationError("must be an identifier", operator=op, field="name")
        from tileship.declare.factory import resolve

        resolve(self.factory, operator=op)  # raises for anything that is not a kernel factory
        if self.reference is None or not callable(self.reference):
            raise DeclarationError("a PyTorch reference is required", operator=op, field="reference", hint="pass reference=fn computing the same result")
        if not self.inputs:
            raise DeclarationError("at least one input tensor is required", operator=op, field="inputs")
        if not any(isinstance(a, TensorArg) for a in self.inputs):
            raise DeclarationError("at least one input must be a tensor (it names the device)", operator=op, field="inputs")
        names = [a.name for a in self.inputs + self.outputs]
        if len(set(names)) != len(names):
            raise DeclarationError(f"duplicate tensor names {names}", operator=op, field="inputs")
        self._check_tensors(op)
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
            self._check_exact(op, shape, f"shapes[{i}]")
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
            self._check_exact(op, r.fixed, f"{f}.fixed")
            for a in self.inputs + self.outputs:
                for d in a.dims:
                    e = DimExpr.parse(d)
                    if e.base == r.dim and e.op in ("/", "//") and r.min != r.max:
                        raise DeclarationError(
                            f"{r.dim} is T.dynamic in [{r.min}, {r.max}] but {a.name} declares {d}: not every {r.dim} there divides by {e.k}",
                            operator=op, field=f"{f}.dim",
                            hint=f"declare static shapes=[...] for {r.dim}, or make the dynamic dim one that is not divided")
        for key, tol in self.tolerances.items():
            if key not in DTYPES and key not in {a.name for a in self.outputs}:
                raise DeclarationError(f"{key!r} is neither a dtype nor an output name (outputs: {', '.join(a.name for a in self.outputs)})",
                                       operator=op, field=f"tolerances.{key}",
                                       hint='key by operator dtype ("float16") or by output name ("mean")')
            if not isinstance(tol, Tolerance):
                raise DeclarationError(f"must be a Tolerance(atol, rtol), got {type(tol).__name__}", operator=op, field=f"tolerances.{key}")
        if self.sample is not None and not callable(self.sample):
            raise DeclarationError("sample is not callable", operator=op, field="sample",
                                   hint="pass sample=fn(dims, dtype, device) returning one tensor per input")
        if self.cost is not None and not callable(self.cost):
            raise DeclarationError("cost is not callable", operator=op, field="cost",
                                   hint="pass cost=fn(dims, dtype) returning (flops, bytes) of one call")
        self._check_factory(op)

    def candidate_configs(self) -> list[tuple[str, dict[str, Any]]]:
        """``[(candidate id, partial config)]``; ``[]`` without candidates. Raises DeclarationError."""
        from tileship.declare.candidates import resolve_candidates

        return resolve_candidates(self)

    def _check_factory(self, op: str) -> None:
        from tileship.declare.factory import resolve

        info = resolve(self.factory, operator=op)
        for d, v in self.config.items():
            if not isinstance(v, (int, float, str, bool)):
                raise DeclarationError(f"config values must be int/float/str/bool, got {type(v).__name__}", operator=op, field=f"config.{d}")
        for key, target in self.params.items():
            if key != "dtype" and key not in self.dims:
                raise DeclarationError(f"{key!r} is not a declared dim (dims: {', '.join(self.dims)}) nor \"dtype\"", operator=op,
                                       field=f"params.{key}", hint="map a declared dim or \"dtype\" to the factory's parameter name")
            if target is None and key != "dtype":
                raise DeclarationError(f"dim {key} must be passed to the factory", operator=op, field=f"params.{key}",
                                       hint=f'map it to the factory parameter that takes it, e.g. params={{"{key}": "{key.lower()}"}}')
            if target is not None and not isinstance(target, str):
                raise DeclarationError(f"must be a parameter name or None, got {type(target).__name__}", operator=op, field=f"params.{key}")
        if self.factory_param("dtype") is None and len(self.dtypes) > 1:
            raise DeclarationError(f"passes no dtype to the factory, but dtypes lists {len(self.dtypes)}: every build would be the same kernel",
                                   operator=op, field="params.dtype", hint=f"declare dtypes=(\"{self.dtypes[0]}\",) or map dtype to a parameter")
        sig = info.signature
        if sig is None:
            return
        accepts_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        fname = info.qualname.rpartition(".")[2]
        wanted = [(f"params.{d}" if d in self.params else "params", self.factory_param(d)) for d in self.dims]
        wanted.append(("params.dtype" if "dtype" in self.params else "dtype_param", self.factory_param("dtype")))
        wanted += [(f"config.{k}", k) for k in self.config]
        for cid, cfg in self.candidate_configs():
            wanted += [(f"candidates.{cid}.{k}", k) for k in cfg if k not in self.config]
        for field_name, name in wanted:
            if name is not None and name not in sig.parameters and not accepts_kw:
                known = ", ".join(sig.parameters)
                hint = ('map it: params={"dtype": "<the dtype parameter>"}, or params={"dtype": None} when the factory hard-codes it'
                        if field_name in ("dtype_param", "params.dtype") else
                        f"rename it with params={{...: \"<parameter>\"}} (the factory takes: {known})")
                raise DeclarationError(f"factory {fname}() ({info.form}) has no parameter {name!r} (it takes: {known})", operator=op,
                                       field=field_name, hint=hint)
        required = [p.name for p in sig.parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        given = {n for _, n in wanted if n is not None}
        missing = [n for n in required if n not in given]
        if missing:
            raise DeclarationError(f"factory {fname}() requires {missing} that the declaration never passes", operator=op, field="config",
                                   hint="add them to config={...} or map a dim to them with params=")


def expand(op: Operator, targets: tuple[str, ...] | None = None) -> list[Specialization]:
    """All specializations of ``op`` (for ``targets`` when given, intersected with the op's)."""
    op.check()
    chosen = [t for t in op.targets if targets is None or t in targets]
    cands = [(cid, tuple(cfg.items())) for cid, cfg in op.candidate_configs()] or [("", ())]
    out: list[Specialization] = []
    for target in chosen:
        for dtype in op.dtypes:
            dims_list: list[tuple[tuple[str, int | tuple[int, int]], ...]] = []
            for r in op.ranges:
                dm: dict[str, int | tuple[int, int]] = {**r.fixed, r.dim: (r.min, r.max)}
                dims_list.append(tuple((d, dm[d]) for d in op.dims))
            for shape in op.shapes:
                dims_list.append(tuple((d, shape[d]) for d in op.dims))
            for dims in dims_list:
                for cid, cfg in cands:
                    out.append(Specialization(op.name, dtype, dims, target, candidate=cid, config=cfg))
    return out


def describe(op: Operator) -> dict[str, Any]:
    """A JSON-able description of the declaration (for the lock and release.json; no callables).
    Raises DeclarationError only."""
    from tileship.declare.factory import resolve

    info = resolve(op.factory, operator=op.name)
    return {
        "inputs": [[a.name, list(a.dims)] for a in op.inputs],
        "outputs": [[a.name, list(a.dims)] for a in op.outputs],
        "dtypes": list(op.dtypes),
        "targets": list(op.targets),
        "shapes": [dict(sorted(s.items())) for s in op.shapes],
        "ranges": [{"dim": r.dim, "min": r.min, "max": r.max, "fixed": dict(sorted(r.fixed.items()))} for r in op.ranges],
        "config": dict(sorted(op.config.items())),
        # only operators with candidates carry the key: the description (and the lock) of the others is unchanged
        **({"candidates": [{"id": cid, "config": cfg} for cid, cfg in cands]} if (cands := op.candidate_configs()) else {}),
        "pass_configs": dict(sorted(op.compile_pass_configs().items())),
        "pass_configs_overridden": sorted(k for k in op.pass_configs if k in info.decorator_pass_configs
                                          and info.decorator_pass_configs[k] != op.pass_configs[k]),
        "tolerances": {dt: {"atol": op.tolerance(dt).atol, "rtol": op.tolerance(dt).rtol} for dt in op.dtypes},
        "output_tolerances": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in sorted(op.tolerances.items()) if k not in DTYPES},
        "tensor_dtypes": {a.name: a.dtype for a in op.inputs + op.outputs},
        "scalars": [a.name for a in op.inputs if isinstance(a, ScalarArg)],
        "factory": info.qualname,
        "factory_info": info.to_json(),
        "module": op.module,
        "reference": _qualified(op.reference),
        "sample": _qualified(op.sample) if op.sample is not None else None,
        "cost": _qualified(op.cost) if op.cost is not None else None,
        "fallback": "tested-reference",
    }


def _qualified(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


