"""Operator declarations: what a user writes next to an existing TileLang kernel factory.

An ``Operator`` names the factory (returns a ``T.prim_func``), the fixed config it is built
with, the PyTorch reference, which tensor dims are which, the accepted shapes (explicit
points and/or ``T.dynamic`` ranges), dtypes, tolerances and targets. Nothing here imports
TileLang or torch: declarations are checked, hashed and expanded into ``Specialization``
values without either.

Call convention: ``op(*inputs) -> output`` (or a tuple when several outputs; None when none). The
outputs are the kernel's own (its ``T.empty`` tensors, else its decorator's ``out_idx``), else the
parameters of those names, else the tail; the inputs are its other parameters in declaration order
(``declare.factory.reconcile_out_idx``).
Inputs named in ``mutates`` are updated in place by the kernel and the reference alike (a KV-cache
append): ordinary caller-owned buffers, never allocated by the kernel; ``docs/declaring.md``.

Each tensor has its own dtype (``"same"``: the operator dtype of the specialization, or a
literal such as ``"int32"``) and its dims may be derived from a base dim (``"K/8"``); see
``tileship.declare.dims``. Only base dims are factory parameters and specialization dims.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import DimExpr
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
    #: ``{"dtype": None}`` passes no dtype (a factory that hard-codes its dtypes), and
    #: ``{"dtype": ("in_dtype", "out_dtype")}`` passes it to each of several
    params: Mapping[str, str | tuple[str, ...] | None] = field(default_factory=dict)
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
    #: optional ``applies(config, dims) -> bool``: whether a candidate (its config laid over ``config``) is
    #: built for a shape; dims as declared, a dynamic range's dim as its ``(min, max)``. The first candidate
    #: must apply to every shape: it is what serves a shape that was never tuned
    applies: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None
    #: input names the kernel (and the reference) update in place, e.g. ``("k_cache", "v_cache")``; an
    #: operator that mutates inputs may declare no outputs (its outputs are then not read from the kernel)
    mutates: tuple[str, ...] = ()
    #: the module declaring this operator, where build workers look it up (default: the module
    #: the ``Operator(...)`` call runs in; ``load_operators`` sets the one it found it in)
    module: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        from tileship.declare import sequences

        sequences.normalise(self)  # inputs=[...] is inputs=(...); a non-sequence is refused by check()
        if self.module is None:
            caller = sys._getframe(2).f_globals.get("__name__")  # 0: here, 1: __init__, 2: the declaring module
            object.__setattr__(self, "module", caller)

    def compile_pass_configs(self) -> dict[str, Any]:
        """The pass configs the kernel is compiled with: the ``@tilelang.jit(pass_configs=...)`` of the
        factory, overridden key by key by ``Operator.pass_configs`` (``describe`` lists the overrides)."""
        from tileship.declare.factory import resolve

        return {**resolve(self.factory, operator=self.name).decorator_pass_configs, **self.pass_configs}

    def factory_param(self, name: str) -> str | None:
        """The factory keyword receiving the declared ``name`` (a dim or "dtype"); None: not passed.
        The first of several dtype keywords for "dtype" (``dtype_params`` lists them all)."""
        if name == "dtype":
            return next(iter(self.dtype_params()), None)
        target = self.params.get(name, name)
        return target if isinstance(target, str) else None

    def dtype_params(self) -> tuple[str, ...]:
        """The factory keywords receiving the operator dtype: ``(dtype_param,)`` by default, ``()`` for
        ``params={"dtype": None}``, every one of ``params={"dtype": ("in_dtype", "out_dtype")}``."""
        target = self.params.get("dtype", self.dtype_param)
        if target is None:
            return ()
        return (target,) if isinstance(target, str) else tuple(target)

    # -- derived -------------------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        """The base dims, in order of first appearance (derived dims contribute their base, fixed sizes none)."""
        seen: dict[str, None] = {}
        for arg in self.inputs + self.outputs:
            for d in arg.dims:
                try:
                    e = DimExpr.parse(d)
                except ValueError:
                    seen.setdefault(d)
                    continue
                if not e.literal:
                    seen.setdefault(e.base)
        return tuple(seen)

    @property
    def infers_outputs(self) -> bool:
        """True when ``outputs`` is omitted and read from the kernel's ``T.empty`` tensors; an operator
        that mutates inputs and declares no outputs has none."""
        return not self.outputs and not self.mutates

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

    def check(self) -> None:
        """Raise DeclarationError naming the first bad field; return None when valid (``declare.checks``)."""
        from tileship.declare.checks import check_operator

        check_operator(self)

    def candidate_configs(self) -> list[tuple[str, dict[str, Any]]]:
        """``[(candidate id, partial config)]``; ``[]`` without candidates. Raises DeclarationError."""
        from tileship.declare.candidates import resolve_candidates

        return resolve_candidates(self)

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
                for i, (cid, cfg) in enumerate(cands):
                    if _applies(op, i, cid, cfg, dims):
                        out.append(Specialization(op.name, dtype, dims, target, candidate=cid, config=cfg))
    return out


def _applies(op: Operator, index: int, cid: str, cfg: tuple[tuple[str, Any], ...],
             dims: tuple[tuple[str, Any], ...]) -> bool:
    """``op.applies`` for one candidate and shape (True without it). Raises DeclarationError when it raises,
    returns a non-bool, or refuses the first candidate (the one an untuned shape is served by)."""
    if op.applies is None or not cid:
        return True
    shape = {d: (list(v) if isinstance(v, tuple) else v) for d, v in dims}
    try:
        ok = op.applies({**op.config, **dict(cfg)}, dict(dims))
    except Exception as exc:  # noqa: BLE001 - a user's callable: its failure names the candidate and shape
        raise DeclarationError(f"applies() raised {type(exc).__name__}: {exc} (candidate {cid}, dims {shape})",
                               operator=op.name, field="applies") from exc
    if not isinstance(ok, bool):
        raise DeclarationError(f"applies() must return a bool, got {type(ok).__name__} (candidate {cid})",
                               operator=op.name, field="applies")
    if index == 0 and not ok:
        raise DeclarationError(f"applies() refuses the first candidate {cid} at dims {shape}",
                               operator=op.name, field="applies",
                               hint="the first candidate serves every shape before tuning: it must apply to all")
    return ok


def describe(op: Operator) -> dict[str, Any]:
    """A JSON-able description of the declaration (for the lock and release.json; no callables).
    Raises DeclarationError only."""
    from tileship.declare.factory import resolve
    from tileship.declare.importable import qualified

    info = resolve(op.factory, operator=op.name)
    return {
        "inputs": [[a.name, list(a.dims)] for a in op.inputs],
        "outputs": [[a.name, list(a.dims)] for a in op.outputs],
        "dtypes": list(op.dtypes),
        "targets": list(op.targets),
        "shapes": [dict(sorted(s.items())) for s in op.shapes],
        "ranges": [{"dim": r.dim, "min": r.min, "max": r.max, "fixed": dict(sorted(r.fixed.items()))}
                   for r in op.ranges],
        "config": dict(sorted(op.config.items())),
        # only operators with candidates carry the key: the description (and the lock) of the others is unchanged
        **({"candidates": [{"id": cid, "config": cfg} for cid, cfg in cands]}
           if (cands := op.candidate_configs()) else {}),
        "pass_configs": dict(sorted(op.compile_pass_configs().items())),
        "pass_configs_overridden": sorted(k for k in op.pass_configs if k in info.decorator_pass_configs
                                          and info.decorator_pass_configs[k] != op.pass_configs[k]),
        "tolerances": {dt: {"atol": op.tolerance(dt).atol, "rtol": op.tolerance(dt).rtol} for dt in op.dtypes},
        "output_tolerances": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in sorted(op.tolerances.items())
                              if k not in DTYPES},
        "tensor_dtypes": {a.name: a.dtype for a in op.inputs + op.outputs},
        "scalars": [a.name for a in op.inputs if isinstance(a, ScalarArg)],
        # only operators that mutate inputs carry the key: the description (and the lock) of the others is unchanged
        **({"mutates": list(op.mutates)} if op.mutates else {}),
        "factory": info.qualname,
        "factory_info": info.to_json(),
        "module": op.module,
        # a release re-imports these by name: a lambda or a nested function is refused here, at build time
        "reference": qualified(op.reference, operator=op.name, field="reference"),
        "sample": qualified(op.sample, operator=op.name, field="sample") if op.sample is not None else None,
        "cost": qualified(op.cost, operator=op.name, field="cost") if op.cost is not None else None,
        # only operators with a candidate filter carry the key: the others' descriptions (and locks) are unchanged
        **({"applies": qualified(op.applies, operator=op.name, field="applies")} if op.applies is not None else {}),
        "fallback": "tested-reference",
    }
