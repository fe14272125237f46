"""Decision, Entry and OpShape: what the dispatcher decides, and the values it decides over.

A Decision says which path served a call and why (reasons: see runtime.dispatch); an
Entry is one specialization with its kernel and its call counter; an OpShape is what
the dispatcher needs of a declaration.
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
    #: kernel calls served by this specialization, by any launcher
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

    def kernel_calls(self) -> int:
        return self.calls.value()

    @property
    def fast_calls(self) -> FastCalls:
        """The kernel calls a fast launcher served (``runtime.launch``): ``calls`` less ``adapter_calls``."""
        return FastCalls(self)


class FastCalls:
    """``Entry.fast_calls``, derived at read time; ``value()`` is exact once the calls counted have
    returned (a call racing the read may be seen in one of the two counts and not yet in the other)."""

    __slots__ = ("_entry",)

    def __init__(self, entry: Entry) -> None:
        self._entry = entry

    def value(self) -> int:
        adapter = self._entry.adapter_calls.value()  # read first: ``calls`` then includes every adapter call read
        return max(0, self._entry.calls.value() - adapter)

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
