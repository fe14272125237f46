"""The reference side of the dispatcher: the operator's PyTorch reference, and its calls counted and timed.

``OpRunner`` (``runtime.dispatch``) inherits this; its hot path inlines the common reference call
(``_ref`` with the key's cached telemetry row), and every other reference call comes here. ``_ref`` is
the reference as served: for an operator of several outputs, a list it returns becomes a tuple, so a
caller gets a tuple on the kernel path and the reference path alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tileship.runtime.route as rt
from tileship.runtime.answer import checker
from tileship.runtime.decision import REFERENCE, Decision
from tileship.runtime.telemetry import SAMPLE

if TYPE_CHECKING:
    from tileship.runtime.decision import Entry, OpShape
    from tileship.runtime.route import Route
    from tileship.runtime.telemetry import ShapeTable


class ReferencePath:
    """Mixin: the reference (``reference``, served as ``_ref``), ``serve_reference`` and ``_reference``."""

    shape: OpShape
    name: str
    telemetry: ShapeTable
    _ref: Callable[..., Any]

    @property
    def reference(self) -> Callable[..., Any]:
        """The operator's PyTorch reference, as given (assigning one replaces it on every path)."""
        return self._reference_fn

    @reference.setter
    def reference(self, fn: Callable[..., Any]) -> None:
        self._reference_fn = fn
        ref = rt.tupled(fn) if self.shape.n_outputs > 1 else fn
        self._ref = _rounding(ref, self.shape)

    def serve_reference(self, route: Route, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn(*args)`` for a key ``route`` sends to the reference, counted in the key's telemetry
        row as the reference's own calls are (one counter bump; one call in SAMPLE timed). ``fn`` may be the
        caller's own equivalent on its own arguments (``KernelLinear``: ``F.linear`` on a 3-d ``x``): its answer
        is not held to the operator's outputs at this key, the reference's is (``route.answer``, by the caller)."""
        decision, row = route.ref
        if decision is not route.entry.decision:
            row = self._ref_row(route)
        if next(row.it) % SAMPLE:
            return fn(*args)
        t0 = time.perf_counter_ns()
        res = fn(*args)
        row.timed(time.perf_counter_ns() - t0)
        return res

    def _ref_row(self, route: Route) -> Any:
        """Cache on ``route`` the telemetry row of its entry's current decision, stored with that
        decision as one tuple: threads racing a decision change never pair a row with another reason."""
        decision = route.entry.decision
        row = self.telemetry.row(route.shape, decision.reason)
        route.ref = (decision, row)
        return row

    def _reference(self, args: tuple[Any, ...], reason: str, entry: Entry, outs: tuple[Any, ...] | None = None,
                   route: Route | None = None) -> tuple[Any, Decision]:
        """The reference's answer (written into the checked ``outs`` when given) and the decision naming
        ``reason``; the call is recorded in telemetry under the key's shape."""
        t0 = time.perf_counter_ns()
        res = self._ref(*args)
        ns = time.perf_counter_ns() - t0
        self.telemetry.record(route.shape if route is not None else None, reason, ns)  # a refused answer too
        res = route.answer(res) if route is not None else checker(self.name, self.shape.n_outputs, None)(res)
        if outs is not None:
            res = rt.fill_out(outs, res, self.name)
        d = entry.decision
        if d.path != REFERENCE or d.reason != reason:
            d = Decision(REFERENCE, reason, d.spec_id)
        return res, d


#: the float dtypes narrower than a Python float, which a kernel's by-value parameter rounds a float to
_NARROW = frozenset(("float32", "float16", "bfloat16"))


def _rounding(ref: Callable[..., Any], shape: OpShape) -> Callable[..., Any]:
    """``ref``, handed each float of a ScalarArg declared with a narrower float dtype (``ScalarArg("alpha",
    dtype="float32")``) as that dtype holds it (``declare.inputs.as_declared``), as the kernel is handed it: a
    float64 operator's answer for ``alpha=0.1`` then does not depend on which path served it (the kernel computed
    with 0.10000000149011612, the reference with 0.1). ``ref`` itself when the operator has no such scalar."""
    narrow = tuple((i, shape.dtypes[i]) for i in shape.scalars if i < len(shape.dtypes) and shape.dtypes[i] in _NARROW)
    if not narrow:
        return ref
    from tileship.declare.inputs import as_declared

    def rounded(*args: Any) -> Any:
        if not any(i < len(args) and type(args[i]) is float for i, _ in narrow):
            return ref(*args)
        got = list(args)
        for i, dtype in narrow:
            if i < len(got):
                got[i] = as_declared(got[i], dtype)
        return ref(*got)

    return rounded


__all__ = ["ReferencePath"]
