"""Decision, Entry and OpShape: what the dispatcher decides, and the values it decides over.

A Decision says which path served a call and why (the reasons below); an
Entry is one specialization with its kernel and its call counter; an OpShape is what
the dispatcher needs of a declaration.

Reasons (``Decision.reason``):
    kernel               the compiled kernel ran
    undeclared_shape     no specialization covers these shapes (or a derived dim such as K/8
                         does not match its base)
    undeclared_dtype     no specialization covers these dtypes (each input's own, e.g. an int32
                         length that arrives as int64; or "same"-dtype inputs that disagree)
    device_not_covered   no specialization was built/loaded for this device (type or arch)
    non_contiguous       the kernel needs contiguous inputs
    misaligned           an input (or an ``out`` the kernel would write) is not 16-byte aligned, e.g. a
                         contiguous slice at an offset: never handed to a TMA or vector load
    no_data              an input (or such an ``out``) has no data a kernel can read: a FakeTensor (FakeTensorMode,
                         torch.compile's tracing; its null data pointer would crash the kernel) or a tensor with no
                         storage (vmap's batched tensors, a DTensor); the reference computes on it as torch does
    drift                blocking environment drift against the lock
    build_failed         the specialization failed to compile at build time
    load_failed          its artifact failed to load or warm up here
    unverified           on a GPU without verification evidence (and unverified not allowed); any
                         specialization when the evidence is not the one pinned at activation
    verification_failed  evidence says the kernel was wrong on this device
    slower_than_reference  evidence says the reference is faster for this shape
    not_selected         a candidate that tuning did not pick for this shape (another one serves it)
    tuning_failed        tune could not check the reference of this shape's group (its answer broke the
                         declaration, or it raised): nothing was measured, no kernel is routed there
    disabled_by_policy   an operator switched this specialization (or the release) off
    circuit_open         the kernel raised or returned non-finite values at serve time
    requires_grad        grad mode is on and an input requires grad: the reference serves, so autograd
                         records the call (a kernel's output would have no ``grad_fn``)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import SAME, resolve_dtype
from tileship.declare.spec import Specialization
from tileship.runtime.counter import Counter

KERNEL = "kernel"
REFERENCE = "reference"


@dataclass(frozen=True)
class Decision:
    """Which path served a call and why; ``spec_id`` names the specialization when one matched."""

    path: str
    reason: str
    spec_id: str | None = None


@dataclass
class Entry:
    """One specialization as the dispatcher sees it. Mutable only through ``OpRunner.disable``."""

    spec: Specialization | None
    kernel: Callable[..., Any] | None
    decision: Decision
    detail: str = ""
    #: kernel calls the Python dispatcher served for this specialization, by any launcher (those of the
    #: compiled table are ``native_calls``; ``kernel_calls()`` is both)
    calls: Counter = field(default_factory=Counter)
    #: of those, the calls TileLang's adapter served (no fast launcher for the key:
    #: ``OpRunner.launchers()`` says why). A fast launch bumps ``calls`` only: one counter per call
    adapter_calls: Counter = field(default_factory=Counter)
    #: the loaded TileLang kernel object (sources, params) when one was loaded
    artifact: Any = None
    #: optional per-size rule (evidence routing of a T.dynamic range): ``choose(bound_dims)``
    #: returns a reference reason for sizes the kernel should not serve, else None. Called on
    #: the slow path only (first call of a key, then memoized), never per call.
    choose: Callable[[Mapping[str, int]], str | None] | None = None
    #: the kernel calls the compiled dispatch table served (``runtime.native``), read from it; None
    #: when no table serves this entry. Those calls bump no Python counter
    native_calls: Callable[[], int] | None = None

    #: called (no arguments) after ``kernel`` is assigned: the compiled tables holding this entry's kernel
    #: drop their rows (``runtime.table_rows``), so a kernel swapped in is never bypassed
    on_kernel_change: list[Callable[[], Any]] = field(default_factory=list, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "kernel":
            for hook in self.__dict__.get("on_kernel_change", ()):
                hook()

    def kernel_calls(self) -> int:
        """Kernel calls served by this specialization, by any path."""
        native = self.native_calls
        return self.calls.value() + (native() if native is not None else 0)

    @property
    def fast_calls(self) -> FastCalls:
        """The kernel calls a fast launcher served (``runtime.launch``): ``calls`` less ``adapter_calls``."""
        return FastCalls(self)


class FastCalls:
    """``Entry.fast_calls``, derived at read time (the compiled table's calls included); ``value()`` is
    exact once the calls counted have returned (a call racing the read may be seen in one of the two
    counts and not yet in the other)."""

    __slots__ = ("_entry",)

    def __init__(self, entry: Entry) -> None:
        self._entry = entry

    def value(self) -> int:
        adapter = self._entry.adapter_calls.value()  # read first: ``calls`` then includes every adapter call read
        return max(0, self._entry.kernel_calls() - adapter)

    def __repr__(self) -> str:
        return f"FastCalls({self.value()})"


@dataclass(frozen=True)
class OpShape:
    """What the dispatcher needs of a declaration (no callables beyond the reference)."""

    name: str
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    n_outputs: int
    #: each input's dtype expression ("same" or a literal); empty: all "same"
    dtypes: tuple[str, ...] = ()
    #: positions of ScalarArg inputs (Python numbers, not part of the dispatch key's shapes)
    scalars: tuple[int, ...] = ()
    #: the declared outputs (name, dims) and each one's dtype expression; empty: not known
    #: (the fast launcher and an up-front ``out=`` check then have no shapes to go by)
    outputs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    out_dtypes: tuple[str, ...] = ()
    #: positions of the inputs the operator updates in place (``Operator.mutates``): the kernel and
    #: the reference both write them; with no outputs declared the operator returns None
    mutates: tuple[int, ...] = ()

    def input_dtypes(self, op_dtype: str) -> list[str]:
        """Each input's dtype name in a specialization of ``op_dtype``."""
        exprs = self.dtypes or (SAME,) * len(self.inputs)
        return [resolve_dtype(e, op_dtype) for e in exprs]
