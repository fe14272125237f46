"""Dispatch: each call goes to the compiled kernel or to the PyTorch reference, and says why.

``OpRunner.__call__`` derives a key from the arguments (device, dtypes, shapes) and finds
the specialization with one dictionary lookup; the first call of a new key resolves it
(exact static shape, else the ``T.dynamic`` range check) and memoizes the result. It never
compiles: a key no kernel covers goes to the reference, every time, with its reason.

The memoized ``Route`` of a key holds the fast launcher of its kernel (``runtime.launch``):
the compiled entry point resolved once, outputs allocated with ``torch.empty`` from the
declaration's shapes (or the caller's ``out=``), no TileLang adapter per call. Where it cannot
be resolved the adapter serves the key and ``launchers()`` says why. ``Entry.fast_calls``
counts the kernel calls the fast launcher served.

Every call the reference serves is counted once, in the runner's bounded ``telemetry`` table by
(dtypes, shapes, reason), one call in ``SAMPLE`` timed (``runtime.telemetry``); ``snapshot()``'s
counts by reason are those rows summed when read. A kernel call bumps ``Entry.calls`` only.

Memoized keys are also written into the operator's compiled table (``runtime.native``) when the
release has one: ``__call__`` then asks the table first, which keys, checks layout and launches a
tvm-ffi or "c"-target kernel in C, and answers every other key with its route (``runtime.table_rows``). Every decision
change drops the table's rows, so the table serves a key exactly as the Python path would.

The reasons a decision names are listed in ``runtime.decision``.

Inputs may also be passed by their declared names (``runtime.call_args``): they are put in their places first,
and only when a call has keywords, so a positional call pays for nothing but Python's empty ``**named``. An operator
of several outputs returns a tuple on every path: the fast launchers build one, and a list from TileLang's adapter
or from the reference (``runtime.reference_path``) becomes one; with ``out=`` the tuple of the caller's tensors.

An operator that updates inputs in place (``Operator.mutates``) is dispatched the same way: the kernel and the
reference both write the caller's tensors, and one with no declared outputs returns None on either path. With
grad mode on, a call whose tensor requires grad goes to the reference (``requires_grad``), which autograd records.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

import tileship.runtime.native as native_mod
import tileship.runtime.route as rt
import tileship.runtime.scalars as scalars
from tileship.declare.dims import SAME, bind
from tileship.declare.spec import Target
from tileship.errors import CallError
from tileship.runtime.answer import key_checker
from tileship.runtime.breaker import Breaker, fault_args, spanned  # noqa: F401 (fault_args re-exported)
from tileship.runtime.call_args import bind_named, not_tensor, unreadable
from tileship.runtime.decision import KERNEL, REFERENCE, Decision, Entry, OpShape  # noqa: F401 (re-exported)
from tileship.runtime.launch import resolve as resolve_launcher
from tileship.runtime.loaded import Release  # noqa: F401 (re-exported)
from tileship.runtime.reference_path import ReferencePath
from tileship.runtime.route import KEY_OF, Route, check_out, fill_out, key_any, out_result
from tileship.runtime.runner_info import RunnerInfo
from tileship.runtime.spec_index import SpecIndex
from tileship.runtime.table_rows import MEMO_LIMIT, TableRows
from tileship.runtime.telemetry import SAMPLE, ShapeTable, shape_of

_log = logging.getLogger("tileship.runtime.dispatch")


class OpRunner(ReferencePath, Breaker, TableRows, RunnerInfo):
    """Callable operator of a loaded release. Thread-safe.

    Circuit breaker: a kernel that raises is disabled (``circuit_open``) and the reference
    answers. With ``check_finite`` on, a kernel output holding NaN/Inf is recomputed by the
    reference; when the reference's is finite, the specialization is disabled the same way
    and the reference's answer returned (the wrong one never is); inputs updated in place
    (``OpShape.mutates``) are not checked, but restored (cloned per call) before that rerun. Off by
    default: the check costs a device sync per call; when off the call path is unchanged. ``on_fault(entry,
    reason, detail)`` is called (synchronously, exceptions logged and swallowed) each time a
    specialization is disabled that way; ``fault_args()`` gives the failing call's arguments.
    """

    def __init__(self, shape: OpShape, reference: Callable[..., Any], entries: list[Entry], *,
                 device_reasons: Mapping[str, str] | None = None, check_finite: bool = False,
                 on_fault: Callable[[Entry, str, str], Any] | None = None) -> None:
        self.name = shape.name
        self.shape = shape
        self.reference = reference  # ``_ref`` serves it: a list returned for several outputs becomes a tuple
        self.entries = entries
        self._n = len(shape.inputs)
        self._key_of = KEY_OF.get(self._n, key_any)
        self._scalars = tuple(shape.scalars)
        tpos = tuple(i for i in range(self._n) if i not in self._scalars)
        self._tdecl = tuple(shape.inputs[i] for i in tpos)
        self._tdtypes = tuple((shape.dtypes or (SAME,) * self._n)[i] for i in tpos)
        self._tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda args: args
        self._plain = not self._scalars  # every argument is a tensor: the hot path skips ``_tensors``
        if self._scalars:  # scalars add their Python type to the key, never their value
            pick = itemgetter(*tpos)
            self._tensors = (lambda args: (pick(args),)) if len(tpos) == 1 else pick
            ranges = scalars.key_ranges(shape.dtypes, self._scalars, self._n)
            self._key_of = scalars.scalar_key(self._tensors, self._scalars, self._n, *ranges)
        #: the operator's ``sample(dims, dtype, device)`` hook when it declares one (demo, warm-up)
        self.sample: Callable[..., Any] | None = None
        self._memo: dict[tuple[Any, ...], Route] = {}
        self._lock = threading.RLock()  # re-entered: setting an entry's kernel drops the table's rows
        #: reference calls by (dtypes, shapes, reason), bounded (``runtime.telemetry``); the counts by
        #: reason (``snapshot``) are its rows summed when read, so a reference call bumps one counter
        self.telemetry = ShapeTable()
        self._same = tuple(e == SAME for e in self._tdtypes)
        self._index = SpecIndex(shape, entries, tpos, self._tdecl, device_reasons or {})
        self.on_fault = on_fault
        self.faults: dict[str, int] = {}  # kernel_raised / non_finite -> times a specialization was disabled
        #: the compiled table (``runtime.native``) and the routes of its reference rows, by index
        self._table: Any = None
        self._native: Callable[..., Any] | None = None  # ``_table.call`` while it may serve
        self._native_routes: list[Route] = []
        #: recompute non-finite kernel outputs on the reference and open the circuit (see class doc)
        self.check_finite = check_finite
        import torch

        self._grad_on: Callable[[], bool] = torch.is_grad_enabled
        self._tensor_t = torch.Tensor

    @property
    def n_inputs(self) -> int:
        return self._n

    @property
    def all_tensors(self) -> bool:
        """True when every input is a tensor (no ``ScalarArg``)."""
        return self._plain

    # -- hot path ----------------------------------------------------------------
    def __call__(self, /, *args: Any, out: Any = None, **named: Any) -> Any:
        """The output only: a tensor, a tuple of several, or None (no outputs); with ``out``, the caller's tensors
        (``call``'s). Inputs may be passed by their declared names after the positional ones (``call``'s contract).
        The common case (a memoized key served by a kernel) is the compiled table's, when there is one; else
        inlined here: one key tuple, one dict lookup, layout, the launch."""
        if named:  # inputs by name: put in their places once, then the positional call
            return self(*bind_named(self.shape.inputs, args, named, self.name), out=out)
        if self._grad_on() and rt.needs_grad(args):
            return self._grad_call(args, out)[0]
        native = self._native
        route = None
        if native is not None and out is None:
            try:
                res = native(*args)
            except Exception:  # a kernel that raised, or arguments tvm-ffi cannot take: the Python path
                return self._call_plain(args, None)[0]  # decides (and trips the breaker if the kernel raises)
            if type(res) is not int:
                return res
            if res >= 0:  # a route row: the reference, or a Python launcher, serves this key
                route = self._native_routes[res]
                if route.entry.kernel is None:  # an array after a tensor has the tensor's key there; the reference
                    tt = self._tensor_t  # would take it (an exact type test first: this is the reference route's cost)
                    for a in args:
                        if type(a) is not tt and (err := not_tensor(args, self.shape.inputs, (), self.name)):
                            raise err
            elif res != native_mod.MISS:
                route = self._route(args)
                why = native_mod.REASONS.get(res, "misaligned")
                return self._reference(args, why, route.entry, route=route)[0]
        elif out is not None and native is not None and not self._check_finite and self.shape.n_outputs == 1:
            return self._native_out(native, args, out)
        elif out is not None or self._check_finite:
            return self.call(*args, out=out)[0]
        if route is None:
            try:
                route = self._memo[self._key_of(args)]
            except (KeyError, AttributeError, TypeError, ValueError, RuntimeError):  # a new key, or bad arguments
                return self._call_plain(args, None)[0]
            if native is not None and route.native is None:
                self._native_put(route, args)
        entry = route.entry
        kernel = entry.kernel
        if kernel is None:
            decision, row = route.ref  # the telemetry row cached for a decision (one atomic read)
            if decision is not entry.decision:  # first reference call here, or a new decision since
                row = self._ref_row(route)
            try:
                if next(row.it) % SAMPLE:  # the call's one counter bump (``Counter.it``); the answer as declared
                    return route.answer(self._ref(*args))
                t0 = time.perf_counter_ns()  # one call in SAMPLE is timed for telemetry
                res = route.answer(self._ref(*args))
            except Exception:  # arrays the compiled table took by DLPack, with a tensor's key: name them
                if (err := not_tensor(args, self.shape.inputs, self._scalars, self.name)) is not None:
                    raise err from None
                raise
            row.timed(time.perf_counter_ns() - t0)
            return res
        try:
            for a in (args if self._plain else self._tensors(args)):
                if not a.is_contiguous() or (a.data_ptr() or 1) % 16:  # route.ALIGNMENT inlined; 0 is no data
                    break
            else:
                a = None
        except (RuntimeError, AttributeError):  # no storage (vmap's batched tensors), or no tensor (an array the
            return self._call_plain(args, None)[0]  # compiled table took by DLPack): the Python path says which
        if a is not None:  # ``layout_reason`` says which: non_contiguous, misaligned, no_data
            return self._reference(args, rt.layout_reason(args if self._plain else self._tensors(args)), entry,
                                   route=route)[0]
        try:
            if kernel is route.kernel:
                res = route.launch(args, None)  # type: ignore[misc]
            else:
                res = kernel(*args)
                entry.calls.add()
                entry.adapter_calls.add()  # after ``calls``: see ``Entry.fast_calls``
                return tuple(res) if type(res) is list else res  # TileLang's adapter lists several outputs
        except Exception as exc:  # the circuit breaker, the same as call()'s
            self._trip(entry, "kernel_raised", f"kernel raised {type(exc).__name__}: {exc}", args)
            return self._reference(args, "circuit_open", entry, route=route)[0]
        next(entry.calls.it)  # a fast launch's one counter bump (``Counter.it``: cheaper than add())
        return res

    def _native_out(self, native: Callable[..., Any], args: tuple[Any, ...], out: Any) -> Any:
        """``out=`` through the table's OUT: None back, the kernel wrote into ``out``; a tensor, ``out`` could not
        take it (checked as ``call`` checks it, then copied in); an int or an error, ``call`` decides."""
        try:
            res = native(6, out, *args)
        except Exception:  # a kernel that raised, or an ``out`` tvm-ffi cannot take: the Python path decides
            return self.call(*args, out=out)[0]
        if res is None:
            return out
        if type(res) is int:
            return self.call(*args, out=out)[0]
        route = self._route(args)
        outs = check_out(out, route, args, 1, self.name)
        return fill_out(outs, res, self.name)

    def call(self, /, *args: Any, out: Any = None, span: Any = None, **named: Any) -> tuple[Any, Decision]:
        """Run the operator; return (output, decision). The output is a tensor for one declared output, a tuple
        for several (on the kernel and the reference path alike: a reference's list becomes a tuple), None for an
        operator that only updates inputs in place. Inputs are positional, or by their declared names after the
        positional ones, as in Python (``op.call(x, qweight=w, scales=s)``). Raises CallError for unservable args,
        naming the argument: an unknown keyword, an input given twice or not at all, a wrong ``out`` (named ``out``).
        With ``out`` (a tensor; a list or tuple of one per output) the result is written there, on either path,
        and returned: the tensor, or the tuple of the caller's tensors.
        With ``check_finite`` on, a non-finite kernel output is checked against the reference.
        ``span`` (``start()``/``stop()``, e.g. the server's canary timer) brackets routing and launches,
        and never the non-finite check."""
        if named:  # inputs by name: put in their places once
            args = bind_named(self.shape.inputs, args, named, self.name, own="out=, span=")
        if self._grad_on() and rt.needs_grad(args):
            return self._grad_call(args, out)
        if self._check_finite:
            return self._call_checked(args, out, span)
        return self._call_plain(args, out) if span is None else spanned(span, self._call_plain, args, out)

    def _route(self, args: tuple[Any, ...]) -> Route:
        if len(args) != self._n:
            kind = "arguments" if self._scalars else "tensors"
            raise CallError(f"expected {self._n} {kind} ({', '.join(n for n, _ in self.shape.inputs)}), got "
                            f"{len(args)}", operator=self.name)
        try:
            key = self._key_of(args)  # (device, dtype, shape) of every input
        except (AttributeError, RuntimeError):  # not a tensor, or one whose sizes torch will not give (nested)
            raise unreadable(args, self.shape.inputs, self._scalars, self.name) from None
        except ValueError:  # an integer scalar outside its dtype's range (``scalars.scalar_key``)
            scalars.check_scalars(args, self._scalars, self.shape.inputs, self.name, self.shape.dtypes)
            raise
        route = self._memo.get(key)
        return route if route is not None else self._resolve(key, args)

    def _call_plain(self, args: tuple[Any, ...], out: Any) -> tuple[Any, Decision]:
        """``call`` without the non-finite check."""
        route = self._route(args)
        tensors = args if self._plain else self._tensors(args)
        outs = None if out is None else check_out(out, route, tensors, self.shape.n_outputs, self.name)
        entry = route.entry
        kernel = entry.kernel
        if kernel is None:
            d = entry.decision
            if outs is None and d.path == REFERENCE:  # as ``__call__`` serves it (one counter bump)
                return route.answer(self.serve_reference(route, self._ref, args)), d
            return self._reference(args, entry.decision.reason, entry, outs, route)
        fast = kernel is route.kernel
        why = rt.layout_reason(tensors)
        if not why and fast and outs is not None and route.writes_out:  # the kernel writes into ``out``
            why = rt.layout_reason(outs)
        if why:
            return self._reference(args, why, entry, outs, route)
        direct = None if outs is None or rt.overlaps(outs, tensors) else outs  # else the kernel's own, copied in
        try:
            res = route.launch(args, direct) if fast else kernel(*args)  # type: ignore[misc]
        except Exception as exc:  # the circuit breaker: this specialization goes to the reference
            self._trip(entry, "kernel_raised", f"kernel raised {type(exc).__name__}: {exc}", args)
            return self._reference(args, "circuit_open", entry, outs, route)
        entry.calls.add()  # Counter: atomic under the GIL, no lock on the hot path
        if not fast:
            entry.adapter_calls.add()  # after ``calls``: see ``Entry.fast_calls``
            res = tuple(res) if type(res) is list else res  # TileLang's adapter lists several outputs
        if outs is not None:
            res = out_result(outs) if fast and direct is not None else fill_out(outs, res, self.name)
        return res, entry.decision

    def _grad_call(self, args: tuple[Any, ...], out: Any) -> tuple[Any, Decision]:
        """Grad mode on and a tensor requires grad: the reference serves (a kernel's output has no ``grad_fn``)."""
        if out is not None:
            raise CallError("out= with an input that requires grad (autograd cannot record a write into out)",
                            operator=self.name, argument="out", hint="call without out=, or under torch.no_grad()")
        route = self._route(args)
        return self._reference(args, "requires_grad", route.entry, route=route)

    def reference_route(self, *args: Any) -> Route | None:
        """The route of ``args``' key when its specialization sends it to the reference now, else None
        (a kernel serves it). Resolves a first-seen key as a call would, and raises CallError for
        arguments a call would refuse. With the route, a caller that has its own equivalent of the
        reference (``KernelLinear``: ``F.linear``) serves such calls through ``serve_reference``."""
        route = self._route(args)
        return route if route.entry.kernel is None else None

    # -- slow path (first call of a key) -------------------------------------------
    def _resolve(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Route:
        scalars.check_scalars(args, self._scalars, self.shape.inputs, self.name, self.shape.dtypes)
        full, args = args, self._tensors(args)
        rt.check_devices(args, self._tdecl, self.name)
        b = bind(self._tdecl, [tuple(a.shape) for a in args])
        if b.problem in ("rank", "disagree"):
            raise CallError(b.message, operator=self.name, argument=b.argument)
        if b.problem == "derived":  # e.g. qweight's K/8 does not match x's K: not a declared shape
            entry = Entry(None, None, Decision(REFERENCE, "undeclared_shape"), detail=f"{b.argument}: {b.message}")
        else:
            entry = self._index.match(args, b.dims)
        bound = b.dims
        dev = args[0].device
        if entry.kernel is not None and entry.spec is not None and not rt.capability_matches(
                dev, Target(entry.spec.target).compute_capability):  # another GPU model than the one built for
            reason = self._index.device_reasons.get(dev.type, "device_not_covered")
            entry = Entry(entry.spec, None, Decision(REFERENCE, reason, entry.decision.spec_id),
                          detail=f"{dev} has another capability")
        sizes = {d: v for d, v in (entry.spec.dims if entry.spec else ()) if isinstance(v, int)}
        outs = (() if self.shape.mutates and not self.shape.outputs else  # updates inputs in place, returns None
                rt.expected_outputs(self.shape.outputs, self.shape.out_dtypes, self._tdtypes, args, {**sizes, **bound}))
        launcher = resolve_launcher(entry.kernel, outs, full, dev) if entry.kernel is not None else None
        if launcher is not None and launcher.fn is None:
            _log.info("%s: TileLang's adapter serves %s (%s)", self.name, entry.decision.spec_id, launcher.why)
        route = Route(entry, outs, launcher, key_checker(self.shape, outs, args, self._same, entry.decision.reason))
        route.shape = shape_of(args, bound, self._same)  # what telemetry records for this key
        if len(self._memo) < MEMO_LIMIT:
            self._memo[key] = route
        return route

    # -- control -------------------------------------------------------------------
    def disable(self, entry: Entry, reason: str, detail: str = "") -> None:
        """Send a specialization to the reference from now on (all memoized keys share the entry)."""
        with self._lock:
            entry.kernel = None
            entry.decision = Decision(REFERENCE, reason, entry.decision.spec_id)
            entry.detail = detail
            self._drop_rows()
