"""Shape telemetry of the served release, for Prometheus and for ``GET /v2/tileship/telemetry``.

The collector reads each operator's ``runtime.telemetry.ShapeTable`` at scrape time; no metric
is touched per call. Two counter families, labelled ``{operator, dtype, shape, reason}``::

    tileship_reference_calls_total     calls the PyTorch reference served
    tileship_reference_seconds_total   their host seconds (launch time on CUDA, see runtime.telemetry)

Cardinality is bounded: per operator the ``TOP_N`` (dtype, shape, reason) rows with most calls
get their own series (``shape`` is each tensor input's shape, ``4x1024,1024``; ``dtype`` the
operator dtype, else the inputs' dtypes joined by ``,``); every other row, and the table's own
``other`` row, is summed into ``dtype="other", shape="other"`` per reason. A row can move between
its own series and ``other`` from one scrape to the next, and a release swap starts every count
again: read these with ``rate()``/``increase()``, which tolerate counter resets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily

from tileship.runtime.telemetry import Row

if TYPE_CHECKING:
    from tileship.runtime.loaded import Release

#: (dtype, shape, reason) series per operator; the rest are summed as shape="other"
TOP_N = 20
LABELS = ("operator", "dtype", "shape", "reason")


def shape_label(row: Row) -> tuple[str, str]:
    """(dtype, shape) label values of a row."""
    s = row.shape
    assert s is not None
    dtype = s.dtype if s.dtype is not None and len(set(s.dtypes)) == 1 else ",".join(s.dtypes)
    return dtype, ",".join("x".join(map(str, x)) for x in s.shapes)


def series(release: Release, top: int = TOP_N) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    """(operator, dtype, shape, reason) -> (calls, nanoseconds): at most ``top`` series per
    operator plus one ``other`` series per reason."""
    out: dict[tuple[str, str, str, str], tuple[int, int]] = {}

    def add(key: tuple[str, str, str, str], r: Row) -> None:
        calls, ns = out.get(key, (0, 0))
        out[key] = (calls + r.calls, ns + r.ns)

    for name, runner in sorted(release.ops.items()):
        table = runner.telemetry
        rows = table.rows()  # most calls first
        for r in rows[:top]:
            add((name, *shape_label(r), r.reason), r)
        for r in [*rows[top:], *table.other().values()]:
            add((name, "other", "other", r.reason), r)
    return out


class ReferenceCollector:
    """A prometheus-client collector over the release ``current()`` returns (None: nothing served)."""

    def __init__(self, current: Callable[[], Release | None], top: int = TOP_N) -> None:
        self.current = current
        self.top = top

    def describe(self) -> list[Any]:
        return [CounterMetricFamily("tileship_reference_calls", "", labels=LABELS),
                CounterMetricFamily("tileship_reference_seconds", "", labels=LABELS)]

    def collect(self) -> Iterator[Any]:
        calls = CounterMetricFamily("tileship_reference_calls",
                                    "Calls served by the PyTorch reference, by operator, shape and reason "
                                    f"(top {self.top} shapes per operator, the rest as shape=\"other\")", labels=LABELS)
        secs = CounterMetricFamily("tileship_reference_seconds",
                                   "Host seconds of the calls served by the PyTorch reference (launch time on CUDA)",
                                   labels=LABELS)
        release = self.current()
        if release is not None:
            for key, (n, ns) in sorted(series(release, self.top).items()):
                calls.add_metric(list(key), n)
                secs.add_metric(list(key), ns / 1e9)
        yield calls
        yield secs


__all__ = ["LABELS", "TOP_N", "ReferenceCollector", "series", "shape_label"]
