"""Shape telemetry: which calls the PyTorch reference served, at which shapes, why, for how long.

Each ``OpRunner`` owns one ``ShapeTable``. The first call of a memo key (``OpRunner._resolve``,
the slow path) makes a ``Shape`` (the inputs' dtypes and shapes, and the base dims bound from
them, declared or not) and attaches it to the key's ``Route``, which then caches the row of its
reason: a call the reference serves costs one counter bump (the dispatcher's per-reason counts
are these rows summed at read time, ``calls_by_reason``), and one call in ``SAMPLE`` is timed
(under a lock); the seconds reported are those samples scaled to all calls. The
kernel path records nothing (kernel calls are counted per specialization by ``Entry.calls``,
which the dispatcher bumps anyway; ``kernel_calls`` below is their sum, not a per-shape count).

Memory is bounded: at most ``ROW_LIMIT`` distinct (dtypes, shapes, reason) rows per operator;
calls past that go to the operator's ``other`` row (kept per reason). Keys the dispatcher does
not memoize (past ``MEMO_LIMIT``) make a new ``Shape`` per call and still land in their row.

Seconds are host wall time (``time.perf_counter_ns``) around the sampled reference calls. On CUDA the
reference returns once its kernels are queued, so this is launch time, not GPU time, unless
the reference synchronizes.

``Release.telemetry()`` (and ``GET /v2/tileship/telemetry``) returns, JSON-able::

    {"schema": 1, "release_id": "...", "since": "2026-11-30T20:00:00+00:00",
     "ops": {"add": {
        "rows": [{"dtype": "float32",             # the operator dtype ("same"-dtype inputs), else
                                                  # a list of each input's dtype
                  "dtypes": ["float32", "float32"],  # each tensor input's dtype
                  "dims": {"N": 1000},            # base dims bound from the shapes (may be partial
                                                  # when a derived dim does not match its base)
                  "shapes": [[1000], [1000]],     # each tensor input's shape
                  "reason": "undeclared_shape", "calls": 3, "seconds": 0.00012}, ...],
        "other": {"calls": 0, "seconds": 0.0, "reasons": {"undeclared_shape": {"calls": 0, "seconds": 0.0}}},
        "kernel_calls": 17}}}

Rows are sorted by calls (most first), then dtypes, shapes and reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tileship.runtime.counter import Counter

#: distinct (dtypes, shapes, reason) rows kept per operator; the rest go to ``other``
ROW_LIMIT = 256
#: the dispatcher times one reference call in SAMPLE (the first of each row always)
SAMPLE = 16
_LOCK = threading.Lock()
SCHEMA = 1


class Shape:
    """The telemetry key of one call key: tensor dtypes and shapes, the dims bound from them,
    and the operator dtype when the declaration makes it inferable (None otherwise). ``rows``
    caches the table row of each reason seen, so a repeat call hashes a short string only."""

    __slots__ = ("dtypes", "shapes", "dims", "dtype", "rows")

    def __init__(self, dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], dims: Mapping[str, int],
                 dtype: str | None) -> None:
        self.dtypes = dtypes
        self.shapes = shapes
        self.dims = dict(dims)
        self.dtype = dtype
        self.rows: dict[str, Row] = {}


def shape_of(tensors: Sequence[Any], dims: Mapping[str, int], same: Sequence[bool]) -> Shape:
    """The ``Shape`` of ``tensors`` (torch tensors); ``same[i]``: input i has the operator dtype."""
    dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in tensors)
    op_dtype = next((d for d, s in zip(dtypes, same, strict=False) if s), None)
    return Shape(dtypes, tuple(tuple(int(n) for n in t.shape) for t in tensors), dims, op_dtype)


class Row:
    """Calls and nanoseconds of one (shape, reason); ``shape`` None for an ``other`` row.

    A live row counts every call with ``tick()`` (a ``Counter``: one C call, no lock) and times
    one call in ``SAMPLE`` (``timed``, under a lock); ``snapshot()`` returns a row whose ``calls``
    is exact and whose ``ns`` is the sampled time scaled to all calls."""

    __slots__ = ("shape", "reason", "calls", "ns", "tick", "it", "_count", "_timed", "_timed_ns")

    def __init__(self, shape: Shape | None, reason: str) -> None:
        self.shape = shape
        self.reason = reason
        self.calls = 0  # snapshot values; a live row's are in _count / _timed*
        self.ns = 0
        self._count = Counter()
        #: count one call; returns a running index (``index % SAMPLE == 0``: time this one)
        self.tick = self._count.add
        #: the same count's iterator: ``next(row.it)`` is ``tick()`` without the method-wrapper (``Counter.it``)
        self.it = self._count.it
        self._timed = 0
        self._timed_ns = 0

    def timed(self, ns: int) -> None:
        with _LOCK:
            self._timed += 1
            self._timed_ns += ns

    def snapshot(self) -> Row:
        c = Row(self.shape, self.reason)
        c.calls = self._count.value()
        with _LOCK:
            t, tn = self._timed, self._timed_ns
        c.ns = round(tn * c.calls / t) if t else 0
        return c


class ShapeTable:
    """Reference calls of one operator by (dtypes, shapes, reason), bounded. Thread-safe."""

    def __init__(self, limit: int = ROW_LIMIT) -> None:
        self.limit = limit
        self.since = time.time()
        self._rows: dict[tuple[Any, ...], Row] = {}
        self._other: dict[str, Row] = {}
        self._lock = threading.Lock()

    def record(self, shape: Shape | None, reason: str, ns: int) -> None:
        """Count one reference call of ``ns`` nanoseconds (``shape`` None: into ``other``); the
        slow paths' way in (the dispatcher's hot path ticks a cached ``row`` and samples)."""
        row = self.row(shape, reason)
        row.tick()
        row.timed(ns)

    def row(self, shape: Shape | None, reason: str) -> Row:
        """The live row of (shape, reason), created on first use (``other`` past the limit)."""
        row = shape.rows.get(reason) if shape is not None else None
        return row if row is not None else self._row(shape, reason)

    def _row(self, shape: Shape | None, reason: str) -> Row:
        with self._lock:
            row = None
            if shape is not None:
                key = (shape.dtypes, shape.shapes, reason)
                row = self._rows.get(key)
                if row is None and len(self._rows) < self.limit:
                    row = self._rows[key] = Row(shape, reason)
            if row is None:
                row = self._other.get(reason)
                if row is None:
                    row = self._other[reason] = Row(None, reason)
        if shape is not None:
            shape.rows[reason] = row
        return row

    def rows(self) -> list[Row]:
        """A consistent copy of the rows (values read under the lock), most calls first."""
        with self._lock:
            live = list(self._rows.values())
        rows = [c for r in live if (c := r.snapshot()).calls]
        return sorted(rows, key=lambda r: (-r.calls, r.shape.dtypes, r.shape.shapes, r.reason))  # type: ignore[union-attr]

    def calls_by_reason(self) -> dict[str, int]:
        """Reference calls per reason, every row and ``other`` summed (exact): the dispatcher's
        per-reason counts, aggregated here at read time so that a call bumps one counter only."""
        with self._lock:
            live = [*self._rows.values(), *self._other.values()]
        out: dict[str, int] = {}
        for r in live:
            out[r.reason] = out.get(r.reason, 0) + r._count.value()
        return out

    def other(self) -> dict[str, Row]:
        with self._lock:
            live = sorted(self._other.items())
        return {reason: c for reason, r in live if (c := r.snapshot()).calls}

    def to_json(self, kernel_calls: int) -> dict[str, Any]:
        rows = [row_json(r) for r in self.rows()]
        other = self.other()
        return {"rows": rows,
                "other": {"calls": sum(r.calls for r in other.values()),
                          "seconds": _seconds(sum(r.ns for r in other.values())),
                          "reasons": {k: {"calls": r.calls, "seconds": _seconds(r.ns)} for k, r in other.items()}},
                "kernel_calls": kernel_calls}


def row_json(r: Row) -> dict[str, Any]:
    s = r.shape
    assert s is not None
    return {"dtype": s.dtype if s.dtype is not None else list(s.dtypes), "dtypes": list(s.dtypes),
            "dims": dict(sorted(s.dims.items())), "shapes": [list(x) for x in s.shapes], "reason": r.reason,
            "calls": r.calls, "seconds": _seconds(r.ns)}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _seconds(ns: int) -> float:
    return round(ns / 1e9, 9)


__all__ = ["ROW_LIMIT", "SCHEMA", "Row", "Shape", "ShapeTable", "iso", "row_json", "shape_of"]
