"""The circuit breaker on the dispatcher's side: a kernel that raises, or (``check_finite``) returns
NaN/Inf where the reference does not, is switched off and the reference answers from then on.

``OpRunner`` (``runtime.dispatch``) inherits this; its class doc states the contract. ``fault_args()``
gives an ``on_fault`` hook the failing call's arguments.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import tileship.runtime.route as rt
from tileship.runtime.decision import KERNEL, REFERENCE, Decision, Entry
from tileship.runtime.route import check_out, fill_out

if TYPE_CHECKING:
    from tileship.runtime.decision import OpShape
    from tileship.runtime.route import Route
    from tileship.runtime.telemetry import ShapeTable

_log = logging.getLogger("tileship.runtime.dispatch")
_fault_call = threading.local()
R = TypeVar("R")


def fault_args() -> tuple[Any, ...] | None:
    """The arguments of the call whose fault is being reported, inside an ``on_fault`` hook
    (which runs synchronously in the failing call's thread); None anywhere else."""
    return getattr(_fault_call, "args", None)


class Breaker:
    """Mixin: the breaker's two entry points, ``_call_checked`` and ``_trip``."""

    _lock: threading.RLock
    shape: OpShape
    entries: list[Entry]
    _ref: Callable[..., Any]  # the reference (``OpRunner.reference``), a list result made a tuple
    telemetry: ShapeTable
    faults: dict[str, int]
    on_fault: Callable[[Entry, str, str], Any] | None
    name: str
    _tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]]

    if TYPE_CHECKING:  # OpRunner's and TableRows' methods, which these call
        def _route(self, args: tuple[Any, ...]) -> Route: ...

        def _call_plain(self, args: tuple[Any, ...], out: Any) -> tuple[Any, Decision]: ...

        def _drop_rows(self) -> None: ...

    def _call_checked(self, args: tuple[Any, ...], out: Any, span: Any = None) -> tuple[Any, Decision]:
        """``call`` with the non-finite check (``check_finite`` on); ``span`` around the plain call only."""
        outs = None if out is None else check_out(out, self._route(args), self._tensors(args),
                                                  self.shape.n_outputs, self.name)
        saved = [args[i].clone() for i in self.shape.mutates]  # the reference reruns on the inputs as they were
        res, d = self._call_plain(args, None) if span is None else spanned(span, self._call_plain, args, None)
        if d.path == KERNEL and not rt.all_finite(res):
            for i, before in zip(self.shape.mutates, saved, strict=True):
                args[i].copy_(before)
            t0 = time.perf_counter_ns()
            ref = self._route(args).answer(self._ref(*args))
            ns = time.perf_counter_ns() - t0
            if rt.all_finite(ref):  # else the inputs make both paths non-finite: nothing to blame the kernel for
                entry = next(e for e in self.entries if e.decision.spec_id == d.spec_id)
                self._trip(entry, "non_finite", "kernel output has NaN/Inf where the reference's is finite", args)
                self.telemetry.record(self._route(args).shape, "circuit_open", ns)
                res, d = ref, Decision(REFERENCE, "circuit_open", d.spec_id)
        return (res if outs is None else fill_out(outs, res, self.name)), d

    def _trip(self, entry: Entry, kind: str, detail: str, args: tuple[Any, ...]) -> None:
        """Open the circuit of ``entry``; only the call that opens it counts, logs and calls the
        hook (threads racing on the same failing kernel report it once)."""
        with self._lock:
            if entry.kernel is None:
                return
            entry.kernel = None
            entry.decision = Decision(REFERENCE, "circuit_open", entry.decision.spec_id)
            entry.detail = detail
            self.faults[kind] = self.faults.get(kind, 0) + 1
            self._drop_rows()
        _log.warning("circuit open: %s now serves the reference (%s)", entry.decision.spec_id, detail)
        hook = self.on_fault
        if hook is None:
            return
        _fault_call.args = args
        try:
            hook(entry, "circuit_open", detail)
        except Exception:
            _log.exception("on_fault hook failed for %s", entry.decision.spec_id)
        finally:
            _fault_call.args = None



def spanned(span: Any, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` between ``span.start()`` and ``span.stop()`` (stopped on an error too)."""
    span.start()
    try:
        return fn(*args)
    finally:
        span.stop()


__all__ = ["Breaker", "fault_args", "spanned"]
