"""Which specialization of an operator covers a call: the index ``OpRunner`` resolves a new key with.

Built once per runner from its entries. ``match`` looks up the exact static shape first (one
dictionary lookup), then the ``T.dynamic`` ranges (range check, fixed dims, and a tuned size
rule that may decline a size), and otherwise says why none covers the call: the device, the
dtypes, or the shapes. It runs on the first call of a key only; the runner memoizes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tileship.declare.dims import shape_at
from tileship.release.tuning import NOT_SELECTED
from tileship.runtime.decision import KERNEL, REFERENCE, Decision, Entry, OpShape

#: reasons a static specialization has no kernel at all: a ``T.dynamic`` range that covers its shape serves it
NO_ARTIFACT = ("build_failed", "load_failed")


class SpecIndex:
    """The entries of one operator by (device type, tensor dtypes, shapes) and by dynamic range."""

    def __init__(self, shape: OpShape, entries: Sequence[Entry], tpos: Sequence[int],
                 tdecl: Sequence[tuple[str, tuple[str, ...]]], device_reasons: Mapping[str, str]) -> None:
        import torch

        self._exact: dict[tuple[Any, ...], Entry] = {}
        self._dynamic: list[tuple[Entry, str, tuple[Any, ...], str, int, int, dict[str, int]]] = []
        self._dtypes: set[tuple[Any, ...]] = set()
        self._devices = {("cpu" if e.spec.target == "c" else "cuda") for e in entries if e.spec}
        #: device type -> reason when no kernel serves that device at all
        self.device_reasons = dict(device_reasons)
        for e in entries:
            s = e.spec
            assert s is not None
            if e.decision.reason == NOT_SELECTED:  # a candidate tuning did not pick: listed, never routed to
                continue
            names = shape.input_dtypes(s.dtype)
            dt = tuple(getattr(torch, names[i]) for i in tpos)
            self._dtypes.add(dt)
            dev = "cpu" if s.target == "c" else "cuda"
            dims = s.dim_map()
            dyn = s.dynamic_dim
            if dyn is None:
                key = (dev, *dt, *(shape_at(ds, dims) for _, ds in tdecl))  # type: ignore[arg-type]
                self._exact[key] = e
            else:
                lo, hi = dims[dyn]  # type: ignore[misc]
                fixed = {d: v for d, v in dims.items() if d != dyn}
                self._dynamic.append((e, dev, dt, dyn, lo, hi, fixed))  # type: ignore[arg-type]

    def match(self, args: Sequence[Any], bound: Mapping[str, int]) -> Entry:
        """The entry serving tensors ``args`` whose base dims are ``bound``; a reference entry
        with its reason when none does. A static shape whose kernel failed to build or load is served by
        a range's kernel that covers it, when one does (else its own reason stands)."""
        exact = self._exact.get((args[0].device.type, *(a.dtype for a in args), *(tuple(a.shape) for a in args)))
        if exact is not None and (exact.kernel is not None or exact.decision.reason not in NO_ARTIFACT):
            return exact
        covering = self._in_range(args, bound)
        if exact is not None:  # a static shape whose kernel never built or loaded: a range's kernel may serve it
            if covering is not None and covering.kernel is not None and covering.decision.path == KERNEL:
                return covering
            return exact
        if covering is not None:
            return covering
        dev = args[0].device.type
        if dev not in self._devices:
            return Entry(None, None, Decision(REFERENCE, self.device_reasons.get(dev, "device_not_covered")))
        if tuple(a.dtype for a in args) not in self._dtypes:
            return Entry(None, None, Decision(REFERENCE, "undeclared_dtype"))
        return Entry(None, None, Decision(REFERENCE, "undeclared_shape"))

    def _in_range(self, args: Sequence[Any], bound: Mapping[str, int]) -> Entry | None:
        """The entry of the ``T.dynamic`` range covering the call (a range whose tuned size rule declines the
        size: a reference entry saying so); None when no range covers it."""
        dev = args[0].device.type
        dts = tuple(a.dtype for a in args)
        refused: Entry | None = None
        for e, edev, dt, dyn, lo, hi, fixed in self._dynamic:
            if edev == dev and dts == dt and lo <= bound[dyn] <= hi and all(bound[d] == v for d, v in fixed.items()):
                why = e.choose(bound) if e.choose is not None and e.kernel is not None else None
                if why is None:
                    return e
                if refused is None or refused.decision.reason == NOT_SELECTED:  # the size rule's own reason wins
                    refused = Entry(e.spec, None, Decision(REFERENCE, why, e.decision.spec_id), detail=e.detail)
        return refused  # every kernel of this range declined this size (another candidate may not have), or None
