"""A loaded release's operators as ``torch.library`` custom ops, for eager, ``torch.compile``
and CUDA graphs.

``register(release)`` defines one custom op per operator, ``torch.ops.tileship_<release
id>.<operator>``, whose implementation is ``OpRunner.call``: the same dispatch, fallback
and counters as calling the release directly. Its fake (meta) implementation computes the
output from the declaration (each output dim from the input dims it derives from, e.g. ``K/8``;
its declared dtype, or for a ``"same"`` output the dtype of the first ``"same"`` input; the
device of the first input), so ``torch.compile(..., fullgraph=True)`` traces
through without running anything and without guarding on sizes: shapes the release does
not cover are a runtime decision of the dispatcher, not a recompilation.

An operator that updates inputs in place (``mutates``) declares them in its schema (``Tensor(a!)``)
and in ``mutates_args``, and returns None when it has no outputs: ``torch.compile`` functionalizes
the call and writes the results back into the caller's tensors.

Each operator (with outputs, updating no input in place) also gets an ``out=`` form,
``torch.ops.tileship_<release id>.<operator>_out(..., out)`` (``ops.out("gemm")``), a custom op
that mutates ``out`` (one tensor, or a list for several outputs) and returns nothing:
``OpRunner(..., out=out)`` (through the compiled table's OUT call where the release has one: the kernel
writes into ``out`` itself), so a wrong ``out`` is a CallError naming it and either path writes into it.

Registering the same release id again (a second ``load`` in the process) rebinds the
existing ops to the newly loaded release; another release gets its own namespace, so two
releases can serve side by side.

Eager hot loops: ``ops.eager("gemm")`` is the same operator without torch's dispatcher, which costs
about 12 us a call on the CPU (a decode step of a small model makes dozens of calls). It runs the
implementation directly, and hands the call to the custom op while ``torch.compile`` traces or
when autograd would record it, so compiled graphs and gradients see the custom op as before.
``swap`` gives the replaced layers this form.

CUDA graphs: the implementation does no host synchronisation, and allocates outputs only
through torch's caching allocator (TileLang allocates ``out_idx`` outputs with
``torch.empty``; the reference is torch). Under graph replay the Python dispatcher does not
run: the path chosen at capture is replayed, and counters count captures, not replays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tileship.declare.dims import SAME, DimExpr
from tileship.declare.outputs_at import outputs_at
from tileship.declare.specialization import call_dtypes
from tileship.errors import CallError, lookup
from tileship.runtime.answer import outputs_of
from tileship.runtime.dispatch import OpRunner, Release
from tileship.runtime.route import needs_grad

PREFIX = "tileship_"

_lock = threading.Lock()
#: "namespace::op" -> the runner that currently serves it (rebound on re-registration)
_runners: dict[str, OpRunner] = {}
#: namespace -> the TorchOps of the release registered under it
_registered: dict[str, TorchOps] = {}
#: "namespace::op" -> the implementation behind the custom op (what ``EagerOp`` calls directly)
_impls: dict[str, Callable[..., Any]] = {}
#: "namespace::op" -> True for an operator with one output that updates no input (``EagerOp``'s direct call)
_direct: dict[str, bool] = {}


@dataclass(frozen=True)
class TorchOps:
    """The custom ops of one release: ``ops.gemm(a, b)`` or ``ops["gemm"]`` (an ``OpOverload``)."""

    release_id: str
    kernel_revision: str
    namespace: str
    ops: Mapping[str, Any]
    #: operator -> its ``out=`` form (``<operator>_out``), when it could be defined
    out_ops: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy/pickle probe dunders before ``ops`` exists
            raise AttributeError(name)
        try:
            return self.ops[name]
        except KeyError:
            raise AttributeError(f"release {self.release_id} has no operator {name!r} (it has: "
                                 f"{', '.join(sorted(self.ops))})") from None

    def __getitem__(self, name: str) -> Any:
        return lookup(self.ops, name, "unknown operator", f"release {self.release_id}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.ops)

    def out(self, name: str) -> Any:
        """The ``out=`` form of ``name``: ``ops.out("add")(a, b, out=c)`` writes into ``c``."""
        return lookup(self.out_ops, name, "no out= form", f"release {self.release_id}")

    def eager(self, name: str) -> EagerOp:
        """``name`` for eager hot loops: the implementation without torch's dispatcher (see the module doc)."""
        op = self[name]
        qual = f"{self.namespace}::{name}"
        return EagerOp(op, _impls[qual], qual, _direct.get(qual, False))

    def runner(self, name: str) -> OpRunner:
        """The OpRunner serving ``name`` now (the latest registered load of this release)."""
        return _runners[f"{self.namespace}::{name}"]


class EagerOp:
    """One custom op called without torch's dispatcher in eager mode; the custom op itself while
    ``torch.compile`` traces, or when grad mode is on and a tensor argument requires grad.
    ``__call__`` is the hot path: for an operator with one output that updates no input, the
    runner serving the op now (``_runners``, rebound on re-registration) is called directly,
    and the output is what its path returned (as the reference itself would return it); with
    ``check_finite`` on, or for other operators, the custom op's implementation runs (it
    refuses ``check_finite`` under CUDA graph capture and returns contiguous outputs)."""

    __slots__ = ("direct", "impl", "op", "qual")

    def __init__(self, op: Any, impl: Callable[..., Any], qual: str, direct: bool) -> None:
        self.op = op
        self.impl = impl
        self.qual = qual
        self.direct = direct

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and needs_grad(args)):
            return self.op(*args)
        runner = _runners[self.qual]
        if self.direct and not runner.check_finite:
            return runner(*args)
        return self.impl(*args)

    def current(self) -> Any:
        """The runner serving the op now (rebound when the release is registered again)."""
        return _runners[self.qual]

    def reference_route(self, *args: Any) -> tuple[Any, Any] | None:
        """(runner, the route of ``args``' key when the runner sends it to the reference, else None),
        for a caller that serves reference-routed calls itself (``OpRunner.serve_reference``);
        None while ``torch.compile`` traces or autograd must see the custom op."""
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and needs_grad(args)):
            return None
        runner = _runners[self.qual]
        return runner, runner.reference_route(*args)

    def __repr__(self) -> str:
        return f"eager({self.op})"


def namespace_of(release_id: str) -> str:
    """``tileship_<release id>``; raises ValueError for an id that is not a torch identifier."""
    ns = PREFIX + release_id
    if not ns.isidentifier():
        raise ValueError(f"release id {release_id!r} cannot name a torch.library namespace")
    return ns


def register(release: Release) -> TorchOps:
    """Register (or rebind) every operator of ``release`` as a custom op. Thread-safe, idempotent.

    Returns the TorchOps; ``torch.ops.tileship_<release id>.<name>`` names the same ops.
    """
    ns = namespace_of(release.release_id)
    with _lock:
        for name, runner in release.ops.items():
            _runners[f"{ns}::{name}"] = runner
        known = _registered.get(ns)
        if known is not None and set(known.ops) == set(release.ops):
            return known
        ops = dict(known.ops) if known is not None else {}
        out_ops = dict(known.out_ops) if known is not None else {}
        for name in sorted(release.ops):
            if name not in ops:
                decl = release.declarations[name]
                exprs = call_dtypes(decl)
                ops[name] = _define(ns, name, decl["inputs"], decl["outputs"], exprs,
                                    decl.get("scalars") or (), decl.get("mutates") or ())
                if f"{name}_out" not in release.ops and decl["outputs"] and not decl.get("mutates"):
                    out_ops[name] = _define_out(ns, name, decl["inputs"], len(decl["outputs"]),
                                                exprs, decl.get("scalars") or ())
        torch_ops = TorchOps(release.release_id, release.kernel_revision, ns, ops, out_ops)
        _registered[ns] = torch_ops
        return torch_ops


def registered(release_id: str) -> TorchOps | None:
    """The ops registered for ``release_id`` in this process, or None."""
    return _registered.get(namespace_of(release_id))


def _define(ns: str, name: str, inputs: Sequence[Sequence[Any]], outputs: Sequence[Sequence[Any]],
            dtypes: Mapping[str, str] | None = None, scalars: Sequence[str] = (), mutates: Sequence[str] = ()) -> Any:
    """The custom op of one operator; inputs in ``mutates`` are ``Tensor(x!)`` in its schema (each its own
    alias set) and in ``mutates_args``, so functionalization under ``torch.compile`` keeps the writes."""
    qual = f"{ns}::{name}"
    marks = {n: chr(ord("a") + i) for i, n in enumerate(mutates)}
    dtypes = dtypes or {}
    in_decl = tuple((str(n), tuple(str(d) for d in dims), dtypes.get(str(n), SAME)) for n, dims, *_ in inputs)
    out_dims = tuple((str(n), tuple(str(d) for d in dims)) for n, dims, *_ in outputs)
    out_dtypes = tuple(dtypes.get(str(n), SAME) for n, *_ in outputs)
    args = ", ".join(f"{_schema_type(dt) if n in scalars else f'Tensor({marks[n]}!)' if n in marks else 'Tensor'} {n}"
                     for n, _, dt in in_decl)
    in_decl = tuple((n, ds, dt) for n, ds, dt in in_decl if n not in scalars)
    pick = [i for i, (n, *_) in enumerate(inputs) if n not in scalars]
    ret = "Tensor" if len(out_dims) == 1 else "(" + ", ".join("Tensor" for _ in out_dims) + ")"
    impl = _impls[qual] = _implementation(qual, len(out_dims))
    _direct[qual] = len(out_dims) == 1 and not mutates
    op = torch.library.custom_op(qual, impl, mutates_args=tuple(mutates),
                                 schema=f"({args}) -> {ret}")
    fake = _fake(name, in_decl, out_dims, out_dtypes)
    op.register_fake(fake if not scalars else lambda *a: fake(*(a[i] for i in pick)))
    return getattr(getattr(torch.ops, ns), name).default


def _define_out(ns: str, name: str, inputs: Sequence[Sequence[Any]], n_outputs: int, dtypes: Mapping[str, str],
                scalars: Sequence[str]) -> Any:
    """``<name>_out(inputs..., out) -> ()``: the runner called with ``out=out``, mutating ``out``."""
    qual = f"{ns}::{name}"
    args = ", ".join(f"{_schema_type(dtypes.get(str(n), SAME)) if n in scalars else 'Tensor'} {n}"
                     for n, *_ in inputs)
    out_t = "Tensor(a!) out" if n_outputs == 1 else "Tensor(a!)[] out"

    def run(*args: Any) -> None:
        *ins, out = args
        _runners[qual](*ins, out=out)

    op = torch.library.custom_op(f"{qual}_out", run, mutates_args=("out",), schema=f"({args}, {out_t}) -> ()")
    op.register_fake(lambda *a: None)
    return getattr(getattr(torch.ops, ns), f"{name}_out").default


def _schema_type(dtype: str) -> str:
    """The torch schema type of a ScalarArg of ``dtype``."""
    return "bool" if dtype == "bool" else ("float" if dtype.startswith(("float", "bfloat")) or dtype == SAME else "int")


def _implementation(qual: str, n_outputs: int) -> Callable[..., Any]:
    def run(*args: torch.Tensor) -> Any:
        runner = _runners[qual]
        first = next(a for a in args if isinstance(a, torch.Tensor))
        if getattr(runner, "check_finite", False) and first.is_cuda and torch.cuda.is_current_stream_capturing():
            raise CallError("check_finite is on: its NaN check synchronizes with the host, which a CUDA graph capture "
                            "cannot do",
                            operator=runner.name, hint="turn check_finite off for the runners of a model you capture")
        out, _ = runner.call(*args)
        if n_outputs == 0:  # an operator that only updates inputs in place
            return None
        if n_outputs == 1 and isinstance(out, torch.Tensor):
            # compiled graphs assume the fake's contiguous layout; a reference (SDPA's flash
            # path, for one) may return another layout
            return out if out.is_contiguous() else out.contiguous()
        # the dispatcher holds a reference's answer to the declaration (``runtime.answer``); a runner without the
        # declared outputs checks their count and type only, as this does again
        outs = outputs_of(runner.name, out, n_outputs, strict=True)
        return outs[0] if n_outputs == 1 else tuple(o if o.is_contiguous() else o.contiguous() for o in outs)

    return run


def _fake(name: str, inputs: tuple[tuple[str, tuple[str, ...], str], ...],
          outputs: tuple[tuple[str, tuple[str, ...]], ...], out_dtypes: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The fake (meta) kernel: outputs (``(name, dims)`` rows) shaped as ``declare.outputs_at`` gives them for the
    dims the inputs bind; CallError naming the output and why where it cannot tell one's shape."""
    def fake(*args: torch.Tensor) -> Any:
        sizes: dict[str, Any] = {}
        derived: list[tuple[str, DimExpr, Any]] = []
        for (arg, dims, _), a in zip(inputs, args, strict=True):
            if a.dim() != len(dims):
                raise CallError(f"has rank {a.dim()} (shape {tuple(a.shape)}), declared ({', '.join(dims)})",
                                operator=name, argument=arg)
            for d, size in zip(dims, a.shape, strict=True):
                e = DimExpr.parse(d)
                if e.literal:  # a fixed size: the dispatcher sends another one to the reference
                    continue
                if e.derived:
                    derived.append((arg, e, size))
                elif d not in sizes:
                    sizes[d] = size
                elif isinstance(size, int) and isinstance(sizes[d], int):
                    if size != sizes[d]:
                        raise CallError(f"dim {d}={size} disagrees with {d}={sizes[d]} of an earlier input",
                                        operator=name, argument=arg)
                else:  # symbolic: the dispatcher raises for disagreeing dims, so the tracer may assume they agree
                    torch._check(size == sizes[d], lambda d=d,
                                 arg=arg: f"{name}({arg}): dim {d} disagrees with an earlier input")
        # a derived dim whose base no input gives plainly (the dispatcher checks the rest)
        whole: dict[str, str] = {}  # base -> why no input gives it
        for arg, e, size in derived:
            if e.base not in sizes and (base := e.inverse(size)) is not None:
                sizes[e.base] = base
            elif e.base not in sizes:
                whole.setdefault(e.base, f"dim {e}={size} of {arg} gives no whole {e.base}")
        same = next((a.dtype for (_, _, dt), a in zip(inputs, args, strict=True) if dt == SAME), args[0].dtype)
        name_of_same = str(same).removeprefix("torch.")
        outs = []
        for o in outputs_at(outputs, out_dtypes, sizes, name_of_same):
            if o.shape is None:  # the reference serves such a call: nothing tells the shape it answers
                why = next((w for b, w in whole.items() if o.why.startswith(f"no input gives dim {b} ")), o.why)
                raise CallError(f"output {o.name} cannot be sized at this call: {why}", operator=name,
                                hint="call it with a shape the declaration covers")
            outs.append(args[0].new_empty(o.shape, dtype=same if o.dtype == name_of_same else getattr(torch, o.dtype)))
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return fake


def mark_dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark ``dims`` of ``t`` dynamic for ``torch.compile`` with no specialization on 0 or 1
    (a decode step has M=1), so one graph serves every size. Returns ``t``."""
    from torch._dynamo.decorators import mark_unbacked

    for d in dims:
        mark_unbacked(t, d)
    return t


__all__ = ["PREFIX", "EagerOp", "TorchOps", "mark_dynamic", "namespace_of", "register", "registered"]
