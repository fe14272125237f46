"""Route: what the dispatcher memoizes per call key, the checks on a caller's ``out=`` and on the layout of a
call's tensors (``layout_reason``), and what a call of several outputs returns (``out_result``, ``tupled``).

The memo key of a call is the (device, dtype, shape) of every input, flat. A key resolves once
(``OpRunner._resolve``, the slow path) to a ``Route``: the specialization's ``Entry`` (shared
by every key it serves: its kernel, decision and counter), the output shapes and dtypes the
declaration gives for these inputs, and the fast launcher (``runtime.launch``) for exactly
these shapes, or why there is none. Per call the dispatcher only checks layout and launches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from tileship.declare.dims import SAME
from tileship.declare.outputs_at import outputs_at
from tileship.errors import CallError
from tileship.runtime import call_args
from tileship.runtime.decision import Entry
from tileship.runtime.launch import Launcher, LaunchFn

_KEY = attrgetter("device", "dtype", "shape")
#: bytes a kernel input's address must be a multiple of (TMA and 128-bit vector loads)
ALIGNMENT = 16


def _key1(args: tuple[Any, ...]) -> tuple[Any, ...]:
    (a,) = args
    return (a.device, a.dtype, a.shape)


def _key2(args: tuple[Any, ...]) -> tuple[Any, ...]:
    a, b = args
    return (a.device, a.dtype, a.shape, b.device, b.dtype, b.shape)


def _key3(args: tuple[Any, ...]) -> tuple[Any, ...]:
    a, b, c = args
    return (a.device, a.dtype, a.shape, b.device, b.dtype, b.shape, c.device, c.dtype, c.shape)


def key_any(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(map(_KEY, args))


#: the memo key of a call, arity-specialized because this is most of the dispatcher's cost per
#: call (one flat tuple, no inner tuples)
KEY_OF: dict[int, Callable[[tuple[Any, ...]], tuple[Any, ...]]] = {1: _key1, 2: _key2, 3: _key3}

OutSpecs = tuple[tuple[tuple[int, ...], Any], ...]


class Route:
    """One memo key's way through the dispatcher. ``kernel`` is the kernel object ``launch`` was
    resolved from: the fast launcher runs only while ``entry.kernel is kernel`` (a disabled or
    swapped kernel is never bypassed)."""

    __slots__ = ("entry", "kernel", "launch", "outs", "launcher", "why", "writes_out", "shape", "ref", "ffi",
                 "anchor", "c_call", "native", "answer")

    def __init__(self, entry: Entry, outs: OutSpecs | None, launcher: Launcher | None = None,
                 answer: Callable[[Any], Any] | None = None) -> None:
        self.entry = entry
        self.outs = outs
        #: ``answer(res) -> res``: the reference's answer held to what is declared at this key (``runtime.answer``;
        #: raises DeclarationError naming the output); every reference call of the key goes through it
        self.answer: Callable[[Any], Any] = answer if answer is not None else _as_is
        fast = launcher is not None and launcher.fn is not None
        self.kernel: Any = entry.kernel if fast else None
        self.launch: LaunchFn | None = launcher.fn if launcher is not None else None
        #: which launcher serves this key: "tvm_ffi" | "tvm_ffi_callee_alloc" | "ctypes" | "adapter"
        self.launcher = launcher.kind if launcher is not None else "adapter"
        #: why the adapter serves this key (empty when a fast launcher does, or no kernel does)
        self.why = launcher.why if launcher is not None else ""
        self.writes_out = launcher.writes_out if launcher is not None else False
        #: the tvm-ffi entry function the compiled table may call for this key (``Launcher.ffi``)
        self.ffi: Any = launcher.ffi if fast and launcher is not None else None
        self.anchor = bool(launcher.anchor) if fast and launcher is not None else False
        self.c_call = launcher.c_call if fast and launcher is not None else None
        #: the key's row in the compiled table: None not written yet, -1 none (a Python launcher
        #: serves), else the entry's slot (a kernel row) or the reference row's index
        self.native: int | None = None
        #: the key's ``runtime.telemetry.Shape`` (set by the dispatcher); reference calls are recorded under it
        self.shape: Any = None
        #: (decision, telemetry row): the reference path's row, cached for the entry's decision then
        #: (``OpRunner._ref_row``); a new decision, e.g. a circuit opening, means a new row
        self.ref: tuple[Any, Any] = (None, None)

    @property
    def decision(self) -> Any:
        """The decision of the entry this key resolved to."""
        return self.entry.decision


def _as_is(res: Any) -> Any:
    return res


def expected_outputs(outputs: Sequence[tuple[str, Sequence[str]]], dtypes: Sequence[str],
                     in_dtypes: Sequence[str], tensors: Sequence[Any], sizes: dict[str, int]) -> OutSpecs | None:
    """Each output's (shape, torch dtype) for these inputs, as the declaration gives it (``declare.outputs_at``
    over the bound dims; ``"same"`` is the dtype of the first ``"same"`` input tensor, else of the first tensor:
    ``loader.op_shape`` has made ``"same"`` the operator's one dtype where no input is ``"same"``). None when the
    declaration has no outputs, or it cannot tell one output's shape (a dim not bound, a division that does not
    divide) or dtype: the fast launcher and an up-front ``out=`` check need them all."""
    import torch

    if not outputs:
        return None
    same = next((t.dtype for t, e in zip(tensors, in_dtypes, strict=False) if e == SAME), tensors[0].dtype)
    name = str(same).removeprefix("torch.")
    specs = []
    for o in outputs_at(outputs, dtypes, sizes, name):
        dtype = same if o.dtype == name else getattr(torch, o.dtype, None)
        if o.shape is None or not isinstance(dtype, torch.dtype):
            return None
        specs.append((o.shape, dtype))
    return tuple(specs)


def check_out(out: Any, route: Route, tensors: Sequence[Any], n_outputs: int, op: str) -> tuple[Any, ...]:
    """The caller's ``out`` as a tuple of tensors; raises CallError (argument ``out``) when one
    has the wrong count, type, shape, dtype or device, or is not contiguous."""
    outs = (out,) if hasattr(out, "data_ptr") else tuple(out) if isinstance(out, (tuple, list)) else None
    if n_outputs == 0:
        raise CallError("the operator has no outputs (it updates inputs in place): there is nothing to write into out",
                        operator=op, argument="out", hint="call without out=")
    if outs is None or len(outs) != n_outputs:
        want = "a tensor" if n_outputs == 1 else f"a sequence of {n_outputs} tensors"
        got = type(out).__name__ + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise CallError(f"expected {want}, got {got}", operator=op, argument="out")
    dev = tensors[0].device
    for i, o in enumerate(outs):
        which = "out" if n_outputs == 1 else f"out[{i}]"
        if not hasattr(o, "data_ptr"):
            raise CallError(f"{which} is a {type(o).__name__}, not a torch.Tensor", operator=op, argument="out")
        if route.outs is not None:
            shape, dtype = route.outs[i]
            if tuple(o.shape) != tuple(shape) or o.dtype != dtype:
                raise CallError(f"{which} is {tuple(o.shape)} {o.dtype}, this call needs {tuple(shape)} {dtype}",
                                operator=op, argument="out")
        if o.device != dev:
            raise CallError(f"{which} is on {o.device}, the inputs on {dev}", operator=op, argument="out",
                            hint="allocate out on the inputs' device")
        if not o.is_contiguous():
            raise CallError(f"{which} is not contiguous", operator=op, argument="out",
                            hint="pass a contiguous tensor (torch.empty(shape, ...))")
        if o.requires_grad and grad_enabled():  # the kernel would write it behind autograd's back
            raise CallError(f"{which} requires grad (autograd cannot record a write into out)", operator=op,
                            argument="out", hint="call under torch.no_grad(), or without out=")
        for j in range(i):  # every path writes each output whole: one would overwrite the other
            if overlaps((o,), (outs[j],)):
                raise CallError(f"out[{j}] and out[{i}] share memory", operator=op, argument="out",
                                hint="pass a tensor of its own for each output")
    return outs


def grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


def overlaps(outs: Sequence[Any], tensors: Sequence[Any]) -> bool:
    """True when a contiguous tensor of ``outs`` shares a byte with a contiguous one of ``tensors`` (an ``out=``
    that is an input: the kernel must not write it while it still reads the input; the compiled table's test)."""
    for o in outs:
        lo = o.data_ptr()
        hi = lo + o.numel() * o.element_size()
        for t in tensors:
            start = t.data_ptr()
            if start < hi and lo < start + t.numel() * t.element_size():
                return True
    return False


def fill_out(outs: tuple[Any, ...], result: Any, op: str) -> Any:
    """Copy ``result`` (a tensor, or a sequence of them) into the checked ``outs``; returns ``out_result(outs)``.
    Raises CallError when a result does not fit (only possible where the declaration could not give the
    output shapes up front)."""
    results = (result,) if len(outs) == 1 and hasattr(result, "data_ptr") else tuple(result)
    for o, r in zip(outs, results, strict=True):
        if o is r:
            continue
        if o.shape != r.shape or o.dtype != r.dtype:
            raise CallError(f"out is {tuple(o.shape)} {o.dtype}, the result {tuple(r.shape)} {r.dtype}",
                            operator=op, argument="out")
        o.copy_(r)
    return out_result(outs)


def out_result(outs: tuple[Any, ...]) -> Any:
    """What a call with ``out=`` returns, whichever path wrote it: the caller's tensor for one output (given
    as a tensor or a sequence of one), the tuple of the caller's tensors for several (given as a list or a
    tuple), as the call without ``out=`` returns a tensor or a tuple."""
    return outs[0] if len(outs) == 1 else outs


def tupled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (an operator's reference) with a list result returned as a tuple: an operator of several outputs
    returns a tuple on every path."""

    def call(*args: Any) -> Any:
        res = fn(*args)
        return tuple(res) if type(res) is list else res

    return call


def check_devices(tensors: Sequence[Any], declared: Sequence[tuple[str, Any]], op: str) -> None:
    """Raises CallError naming the first input that is not a torch.Tensor (an array-like with ``device``,
    ``dtype`` and ``shape``, such as a NumPy array, is not one) or is a nested one, then the first on another
    device than the first one. The slow path only (first call of a key)."""
    import torch

    for (name, _), a in zip(declared, tensors, strict=True):
        if not isinstance(a, torch.Tensor):
            raise CallError(f"expected a torch.Tensor, got {type(a).__module__}.{type(a).__name__}", operator=op,
                            argument=name, hint="convert it with torch.as_tensor / torch.from_numpy")
        if a.is_nested:  # a jagged tensor's shape holds a symbolic size no declared dim binds
            raise call_args.nested(op, name)
    dev = tensors[0].device
    for (name, _), a in zip(declared, tensors, strict=True):
        if a.device != dev:
            raise CallError(f"is on {a.device} but {declared[0][0]} is on {dev}", operator=op, argument=name,
                            hint="move all inputs to one device")


def needs_grad(args: Sequence[Any]) -> bool:
    """True when an argument is a tensor that requires grad (the caller checks grad mode first)."""
    for a in args:
        if getattr(a, "requires_grad", False):
            return True
    return False


def layout_reason(tensors: Sequence[Any]) -> str:
    """Why a kernel may not be handed ``tensors``, argument by argument (the compiled table's order), or '':
    ``non_contiguous``; ``misaligned`` (an address not a multiple of ``ALIGNMENT`` bytes); ``no_data``, a tensor
    with no data a kernel can read: a null data pointer (a FakeTensor's, under FakeTensorMode or torch.compile's
    tracing: it has the key of a real tensor, and the kernel would read address 0) or no storage at all (vmap's
    batched tensors, a DTensor). The reference serves all three (on fake tensors, it computes fake outputs)."""
    for t in tensors:
        if not t.is_contiguous():
            return "non_contiguous"
        try:
            ptr = t.data_ptr()
        except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
            return "no_data"
        if not ptr:
            return "no_data"
        if ptr % ALIGNMENT:
            return "misaligned"
    return ""


def all_finite(out: Any) -> bool:
    """True when no floating output holds NaN/Inf (a device sync on CUDA); True for None (no outputs)."""
    import torch

    if out is None:
        return True
    for t in out if isinstance(out, (tuple, list)) else (out,):
        # a finite sum means every element is finite (NaN and Inf propagate, Inf - Inf is NaN): one
        # reduction and no bool tensor on the usual path; a sum that overflowed gets the full check.
        # 16-bit and wider floats only: torch does not sum the 8-bit ones everywhere (nor isfinite them on the CPU)
        if t.dtype.is_floating_point and not (t.dtype.itemsize > 1 and math.isfinite(t.sum().item())) \
                and not bool(torch.isfinite(t if t.dtype.itemsize > 1 else t.float()).all()):
            return False
    return True



def describe(memo: dict[tuple[Any, ...], Route]) -> dict[str, str]:
    """``spec id [shapes]`` -> the launcher of each memoized key a kernel serves, or ``adapter: <why>``."""
    out = {}
    for key, r in list(memo.items()):
        if r.entry.kernel is None:
            continue
        # a key is flat (device, dtype, shape, ...) up to three tensors, else one (device, dtype, shape) per tensor
        shapes = " ".join("x".join(map(str, k if all(type(d) is int for d in k) else k[-1]))
                          for k in key if isinstance(k, tuple))
        out[f"{r.entry.decision.spec_id} [{shapes}]"] = r.launcher if r.launch else f"adapter: {r.why}"
    return out


def capability_matches(device: Any, capability: tuple[int, int] | None) -> bool:
    """True when CUDA ``device`` has ``capability`` (a specialization's target); True off CUDA."""
    if getattr(device, "type", None) != "cuda" or capability is None:
        return True
    import torch

    return tuple(torch.cuda.get_device_capability(device)) == tuple(capability)


__all__ = ["ALIGNMENT", "KEY_OF", "Route", "all_finite", "capability_matches", "check_devices", "check_out",
           "describe", "expected_outputs", "fill_out", "key_any", "layout_reason", "needs_grad", "out_result",
           "overlaps", "tupled"]
