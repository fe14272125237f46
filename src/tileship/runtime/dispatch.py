"""Dispatch: each call goes to the compiled kernel or to the PyTorch reference, and says why.

``OpRunner.__call__`` derives a key from the arguments (device, dtypes, shapes) and finds
the specialization with one dictionary lookup; the first call of a new key resolves it
(exact static shape, else the ``T.dynamic`` range check) and memoizes the result. It never
compiles: a key no kernel covers goes to the reference, every time, with its reason.

Reasons (``Decision.reason``):
    kernel               the compiled kernel ran
    undeclared_shape     no specialization covers these shapes (or a derived dim such as K/8
                         does not match its base)
    undeclared_dtype     no specialization covers these dtypes (each input's own, e.g. an int32
                         length that arrives as int64; or "same"-dtype inputs that disagree)
    device_not_covered   no specialization was built/loaded for this device (type or arch)
    non_contiguous       the kernel needs contiguous inputs
    drift                blocking environment drift against the lock
    build_failed         the specialization failed to compile at build time
    load_failed          its artifact failed to load or warm up here
    unverified           on a GPU without verification evidence (and unverified not allowed)
    verification_failed  evidence says the kernel was wrong on this device
    slower_than_reference  evidence says the reference is faster for this shape
    disabled_by_policy   an operator switched this specialization (or the release) off
    circuit_open         the kernel raised or returned non-finite values at serve time
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from operator import attrgetter, itemgetter
from typing import Any

from tileship.declare.dims import bind, shape_at
from tileship.errors import CallError
from tileship.runtime.counter import Counter
from tileship.runtime.decision import KERNEL, REFERENCE, Decision, Entry, OpShape  # noqa: F401 (re-exported)
from tileship.runtime.loaded import Release  # noqa: F401 (re-exported)

_KEY = attrgetter("device", "dtype", "shape")


def _key1(args: tuple[Any, ...]) -> tuple[Any, ...]:
    (a,) = args
    return (a.device, a.dtype, a.shape)


def _key2(args: tuple[Any, ...]) -> tuple[Any, ...]:
    a, b = args
    return (a.device, a.dtype, a.shape, b.device, b.dtype, b.shape)


def _key3(args: tuple[Any, ...]) -> tuple[Any, ...]:
    a, b, c = args
    return (a.device, a.dtype, a.shape, b.device, b.dtype, b.shape, c.device, c.dtype, c.shape)


def _key_any(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(map(_KEY, args))


#: the memo key of a call: (device, dtype, shape) of every input, flat. Arity-specialized
#: because this is most of the dispatcher's cost per call (one flat tuple, no inner tuples).
_KEY_OF = {1: _key1, 2: _key2, 3: _key3}
MEMO_LIMIT = 8192
_log = logging.getLogger("tileship.runtime.dispatch")
_fault_call = threading.local()


def fault_args() -> tuple[Any, ...] | None:
    """The arguments of the call whose fault is being reported, inside an ``on_fault`` hook
    (which runs synchronously in the failing call's thread); None anywhere else."""
    return getattr(_fault_call, "args", None)


def _all_finite(out: Any) -> bool:
    import torch

    for t in out if isinstance(out, (tuple, list)) else (out,):
        if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            return False
    return True


class OpRunner:
    """Callable operator of a loaded release. Thread-safe.

    Circuit breaker: a kernel that raises is disabled (``circuit_open``) and the reference
    answers. With ``check_finite`` on, a kernel output holding NaN/Inf is recomputed by the
    reference; when the reference's is finite, the specialization is disabled the same way
    and the reference's answer returned (the wrong one never is). Off by default: the check
    costs a device sync per call; when off the call path is unchanged. ``on_fault(entry,
    reason, detail)`` is called (synchronously, exceptions logged and swallowed) each time a
    specialization is disabled that way; ``fault_args()`` gives the failing call's arguments.
    """

    def __init__(self, shape: OpShape, reference: Callable[..., Any], entries: list[Entry], *,
                 device_reasons: Mapping[str, str] | None = None, check_finite: bool = False,
                 on_fault: Callable[[Entry, str, str], Any] | None = None) -> None:
        self.name = shape.name
        self.shape = shape
        self.reference = reference
        self.entries = entries
        self._n = len(shape.inputs)
        self._key_of = _KEY_OF.get(self._n, _key_any)
        self._scalars = tuple(shape.scalars)
        tpos = tuple(i for i in range(self._n) if i not in self._scalars)
        self._tdecl = tuple(shape.inputs[i] for i in tpos)
        self._tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda args: args
        if self._scalars:  # scalars add their Python type to the key, never their value
            pick = itemgetter(*tpos)
            self._tensors = (lambda args: (pick(args),)) if len(tpos) == 1 else pick
            scal = self._scalars
            self._key_of = lambda args: (*_key_any(self._tensors(args)), *(type(args[i]) for i in scal))
        self._exact: dict[tuple[Any, ...], Entry] = {}
        self._dynamic: list[tuple[Entry, str, tuple[Any, ...], str, int, int, dict[str, int]]] = []
        self._dtypes: set[tuple[Any, ...]] = set()
        #: the operator's ``sample(dims, dtype, device)`` hook when it declares one (demo, warm-up)
        self.sample: Callable[..., Any] | None = None
        # device type -> reason when no kernel serves that device at all
        self._device_reasons = dict(device_reasons or {})
        self._memo: dict[tuple[Any, ...], Entry] = {}
        self._lock = threading.Lock()
        # reference calls by reason (Counter: no lock per call)
        self._ref_counts: dict[str, Counter] = {}
        import torch

        for e in entries:
            s = e.spec
            assert s is not None
            names = shape.input_dtypes(s.dtype)
            dt = tuple(getattr(torch, names[i]) for i in tpos)
            self._dtypes.add(dt)
            dev = "cpu" if s.target == "c" else "cuda"
            dims = s.dim_map()
            dyn = s.dynamic_dim
            if dyn is None:
                key = (dev, *dt, *(shape_at(ds, dims) for _, ds in self._tdecl))  # type: ignore[arg-type]
                self._exact[key] = e
            else:
                lo, hi = dims[dyn]  # type: ignore[misc]
                fixed = {d: v for d, v in dims.items() if d != dyn}
                self._dynamic.append((e, dev, dt, dyn, lo, hi, fixed))  # type: ignore[arg-type]
        self.on_fault = on_fault
        self.faults: dict[str, int] = {}  # kernel_raised / non_finite -> times a specialization was disabled
        #: recompute non-finite kernel outputs on the reference and open the circuit (see class doc)
        self.check_finite = check_finite

    # -- hot path ----------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        """The output only. The common case (a memoized key served by a kernel) is inlined
        here: one tuple of (device, dtype, shape), one dict lookup, contiguity, the launch."""
        try:
            entry = self._memo[self._key_of(args)]
        except (KeyError, AttributeError, TypeError, ValueError):  # first call of this key, or bad arguments
            return self.call(*args)[0]
        if self.check_finite:
            return self._call_checked(args)[0]
        kernel = entry.kernel
        if kernel is None:
            out = self.reference(*args)
            self._ref_counter(entry.decision.reason).add()
            return out
        for a in self._tensors(args):
            if not a.is_contiguous():
                return self._reference(args, "non_contiguous", entry)[0]
        try:
            out = kernel(*args)
        except Exception as exc:
            self.disable(entry, "circuit_open", f"kernel raised {type(exc).__name__}: {exc}")
            return self._reference(args, "circuit_open", entry)[0]
        entry.calls.add()
        return out

    def call(self, *args: Any) -> tuple[Any, Decision]:
        """Run the operator; return (output, decision). Raises CallError for unservable args.
        With ``check_finite`` on, a non-finite kernel output is checked against the reference."""
        if self.check_finite:
            return self._call_checked(args)
        return self._call_plain(args)

    def _call_plain(self, args: tuple[Any, ...]) -> tuple[Any, Decision]:
        """``call`` without the non-finite check."""
        if len(args) != self._n:
            kind = "arguments" if self._scalars else "tensors"
            raise CallError(f"expected {self._n} {kind} ({', '.join(n for n, _ in self.shape.inputs)}), got "
                            f"{len(args)}", operator=self.name)
        try:
            key = self._key_of(args)  # (device, dtype, shape) of every input
        except AttributeError:
            bad = next(i for i, a in enumerate(args) if i not in self._scalars
                       and not all(hasattr(a, f) for f in ("device", "dtype", "shape")))
            raise CallError(f"expected a torch.Tensor, got {type(args[bad]).__name__}", operator=self.name,
                            argument=self.shape.inputs[bad][0]) from None
        entry = self._memo.get(key)
        if entry is None:
            entry = self._resolve(key, args)
        kernel = entry.kernel
        if kernel is None:
            return self._reference(args, entry.decision.reason, entry)
        for a in self._tensors(args):
            if not a.is_contiguous():
                return self._reference(args, "non_contiguous", entry)
        try:
            out = kernel(*args)
        except Exception as exc:  # the circuit breaker: this specialization goes to the reference
            self._trip(entry, "kernel_raised", f"kernel raised {type(exc).__name__}: {exc}", args)
            return self._reference(args, "circuit_open", entry)
        entry.calls.add()  # Counter: atomic under the GIL, no lock on the hot path
        return out, entry.decision

    def _call_checked(self, args: tuple[Any, ...]) -> tuple[Any, Decision]:
        """``call`` with the non-finite check (``check_finite`` on)."""
        out, d = self._call_plain(args)
        if d.path != KERNEL or _all_finite(out):
            return out, d
        ref = self.reference(*args)
        if not _all_finite(ref):
            return out, d  # the inputs make both paths non-finite: nothing to blame the kernel for
        entry = next(e for e in self.entries if e.decision.spec_id == d.spec_id)
        self._trip(entry, "non_finite", "kernel output has NaN/Inf where the reference's is finite", args)
        self._ref_counter("circuit_open").add()
        return ref, Decision(REFERENCE, "circuit_open", d.spec_id)

    def _trip(self, entry: Entry, kind: str, detail: str, args: tuple[Any, ...]) -> None:
        self.disable(entry, "circuit_open", detail)
        with self._lock:
            self.faults[kind] = self.faults.get(kind, 0) + 1
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

    def _ref_counter(self, reason: str) -> Counter:
        c = self._ref_counts.get(reason)
        if c is None:
            with self._lock:
                c = self._ref_counts.setdefault(reason, Counter())
        return c

    def _reference(self, args: tuple[Any, ...], reason: str, entry: Entry) -> tuple[Any, Decision]:
        out = self.reference(*args)
        self._ref_counter(reason).add()
        d = entry.decision if entry.decision.path == REFERENCE and entry.decision.reason == reason else Decision(REFERENCE, reason, entry.decision.spec_id)
        return out, d

    # -- slow path (first call of a key) -------------------------------------------
    def _check_devices(self, args: tuple[Any, ...]) -> None:
        dev = args[0].device
        for (name, _), a in zip(self._tdecl, args, strict=True):
            if a.device != dev:
                raise CallError(f"is on {a.device} but {self._tdecl[0][0]} is on {dev}",
                                operator=self.name, argument=name, hint="move all inputs to one device")

    def _resolve(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Entry:
        for i in self._scalars:
            if not isinstance(args[i], (int, float, bool)):
                raise CallError(f"is a ScalarArg: pass a Python number, got {type(args[i]).__name__}",
                                operator=self.name,
                                argument=self.shape.inputs[i][0],
                                hint="pass float(x) / int(x), or x.item() for a one-element tensor")
        args = self._tensors(args)
        self._check_devices(args)
        b = bind(self._tdecl, [tuple(a.shape) for a in args])
        if b.problem in ("rank", "disagree"):
            raise CallError(b.message, operator=self.name, argument=b.argument)
        if b.problem == "derived":  # e.g. qweight's K/8 does not match x's K: not a declared shape
            entry = Entry(None, None, Decision(REFERENCE, "undeclared_shape"), detail=f"{b.argument}: {b.message}")
        else:
            entry = self._match(key, args, b.dims)
        bound = b.dims
        if entry.choose is not None and entry.kernel is not None:
            why = entry.choose(bound)
            if why is not None:
                entry = Entry(entry.spec, None, Decision(REFERENCE, why, entry.decision.spec_id), detail=entry.detail)
        if len(self._memo) < MEMO_LIMIT:
            self._memo[key] = entry
        return entry

    def _match(self, key: tuple[Any, ...], args: tuple[Any, ...], bound: dict[str, int]) -> Entry:
        exact = self._exact.get((args[0].device.type, *(a.dtype for a in args), *(tuple(a.shape) for a in args)))
        if exact is not None:
            return exact
        dev = args[0].device.type
        dts = tuple(a.dtype for a in args)
        for e, edev, dt, dyn, lo, hi, fixed in self._dynamic:
            if edev == dev and dts == dt and lo <= bound[dyn] <= hi and all(bound[d] == v for d, v in fixed.items()):
                return e
        devices = {("cpu" if e.spec.target == "c" else "cuda") for e in self.entries
                   if e.spec}  # type: ignore[union-attr]
        if dev not in devices:
            return Entry(None, None, Decision(REFERENCE, self._device_reasons.get(dev, "device_not_covered")))
        if dts not in self._dtypes:
            return Entry(None, None, Decision(REFERENCE, "undeclared_dtype"))
        return Entry(None, None, Decision(REFERENCE, "undeclared_shape"))

    # -- inputs --------------------------------------------------------------------
    def sample_inputs(self, dims: Mapping[str, int], dtype: str, device: str, seed: int) -> list[Any]:
        """Valid inputs at base ``dims`` for a specialization of ``dtype``: each with its declared
        dtype, from the operator's ``sample`` hook when it has one (demo, warm-up, benchmarks)."""
        from tileship.declare.inputs import make_inputs

        return make_inputs(self.shape.inputs, dims, dtype, device, seed, dtypes=self.shape.dtypes or None,
                           sample=self.sample, scalars=self.shape.scalars)

    # -- control -------------------------------------------------------------------
    def disable(self, entry: Entry, reason: str, detail: str = "") -> None:
        """Send a specialization to the reference from now on (all memoized keys share the entry)."""
        with self._lock:
            entry.kernel = None
            entry.decision = Decision(REFERENCE, reason, entry.decision.spec_id)
            entry.detail = detail

    def snapshot(self) -> dict[str, int]:
        """Calls so far by ``path:reason``."""
        with self._lock:
            refs = dict(self._ref_counts)
        counts = {(REFERENCE, reason): n for reason, c in refs.items() if (n := c.value())}
        n = sum(e.kernel_calls() for e in self.entries)
        if n:
            counts[(KERNEL, KERNEL)] = n
        return {f"{p}:{r}": v for (p, r), v in sorted(counts.items())}

