"""The latency clock of ``tileship tune``: a call's served latency from its two stable parts.

A stream of calls runs at the pace of the slower of two clocks: the host's (the Python and
driver work to issue one call) and the device's (the kernels of one call). Timed back to back
(``timing.measure``), a call whose host cost is close to its device time reads whichever is
larger at that moment, and on a shared host the host's speed moves: on the H200 host,
``torch.matmul`` at N=K=4096-11008, M <= 256 was timed at 17-30 us in one process and 40-49 us
in the next minute of another (``benchmarks/results/h200/round15/``), while a kernel launched
through the compiled table (host cost 11-15 us, device time 18-48 us) read the same everywhere.
A decision taken on one such reading flips in the next process.

``latency`` times both parts apart, in one loop per sample:

    device   the device is first kept busy (``torch.cuda._sleep``, longer than the host needs to
             issue the sample's calls; the L2 flushed before it), then ``inner`` calls run back to
             back between two CUDA events: the device's time per call, with no host gap in it;
    host     the host time to issue those ``inner`` calls (``perf_counter_ns``; the calls never
             wait, the device is still asleep): the host's cost per call.

and gives ``max(host, device)`` per call, with host the 10th percentile of its samples (a
busy host only adds to it) and device their median: the latency of a call stream on an
uncontended host, which is what the next process will see too. On the CPU both parts are one
(``timing.measure``'s median).

A slow stretch of the host lasts seconds, longer than a timing run, so the 10th percentile does
not remove it (round 16: ``torch.matmul``'s issue cost read 27.9 us through one tune and 16 us in
the served_vs_best run after it, at the same shapes). With a ``HostGauge`` each sample also
times a fixed probe (``PROBE_CALLS`` launches of a one-element fill, issued while the device
sleeps) and scales the sample's host time by (the fastest probe this process has seen) / (this
sample's probe): host costs are stated for the host at its fastest, whatever state it was in
while a path was timed. The raw host time and the probe's slowdown are kept beside it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tileship.verify.timing import measure, quantile

#: the device's clock rate assumed for ``torch.cuda._sleep`` (cycles): a faster clock sleeps less
#: than asked, so the sleep is sized with room to spare (``SLEEP_MARGIN``)
_CYCLES_PER_US = 2000
SLEEP_MARGIN = 3.0
#: device time a sample aims for, us
SAMPLE_US = 100.0


#: launches in one probe of a ``HostGauge``
PROBE_CALLS = 8


@dataclass(frozen=True)
class Latency:
    """One timing run of one path, us per call: ``latency_us`` = max(``host_us``, ``device_us``).
    With a gauge, ``host_us`` is scaled to the host at its fastest; ``host_raw_us`` is as timed and
    ``slowdown`` the median of the samples' probe / fastest probe (1.0 without a gauge)."""

    latency_us: float
    host_us: float
    device_us: float
    inner: int
    repeats: int
    host_raw_us: float = 0.0
    slowdown: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {"latency_us": self.latency_us, "host_us": self.host_us, "device_us": self.device_us,
                "host_raw_us": self.host_raw_us, "slowdown": self.slowdown,
                "calls_per_sample": self.inner, "repeats": self.repeats}


class HostGauge:
    """The host's speed: the issue time of ``PROBE_CALLS`` one-element fills on ``device``, us per
    launch, and the fastest such probe seen so far (``best_us``), which ``calibrate`` seeds."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self._tiny = torch.zeros(1, device=device)
        self._sync = _sync(device)
        self.best_us = math.inf

    def probe(self) -> float:
        """One probe, us per launch (the launches queue behind whatever the device is doing)."""
        h0 = time.perf_counter_ns()
        for _ in range(PROBE_CALLS):
            self._tiny.fill_(0.0)
        us = (time.perf_counter_ns() - h0) / 1e3 / PROBE_CALLS
        self.best_us = min(self.best_us, us)
        return us

    def calibrate(self, seconds: float = 0.5) -> float:
        """Probe for ``seconds`` (synchronizing every 64 probes); returns ``best_us``."""
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds or n < 16:
            self.probe()
            n += 1
            if n % 64 == 0:
                self._sync()
        self._sync()
        return self.best_us


def latency(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], *, device: str, warmup_ms: float = 10.0,
            budget_ms: float = 40.0, min_repeats: int = 5, max_repeats: int = 40, flush: Any = None,
            gauge: HostGauge | None = None) -> Latency:
    """Time ``fn`` over the rotating ``arg_sets`` with the latency clock (module doc). ``flush``: a
    cache-sized buffer overwritten before every sample (``timing.l2_flush_buffer``); ``gauge``: state
    host costs for the host at its fastest (module doc)."""
    if device != "cuda":
        s = measure(fn, arg_sets, device=device, warmup_ms=warmup_ms, budget_ms=budget_ms, min_repeats=min_repeats,
                    max_repeats=max_repeats, flush=flush)
        return Latency(s.median_us, s.median_us, s.median_us, s.inner, s.repeats, s.median_us)
    import torch

    n = len(arg_sets)
    torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms or calls < 3:  # warm-up; estimates one call's cost
        fn(*arg_sets[calls % n])
        calls += 1
        if calls % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    est_us = max((time.perf_counter() - t0) * 1e6 / calls, 0.1)
    inner = max(1, min(64, math.ceil(SAMPLE_US / est_us)))
    probe_us = 0.0 if gauge is None else gauge.probe() * PROBE_CALLS
    sleep_cycles = int(SLEEP_MARGIN * (inner * est_us + probe_us) * _CYCLES_PER_US) + 50 * _CYCLES_PER_US
    repeats = max(min_repeats, min(max_repeats, int(budget_ms * 1e3 / (inner * est_us * (1 + SLEEP_MARGIN)))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    host: list[float] = []
    speed: list[float] = []  # per sample: this sample's probe / the fastest probe
    k = 0
    for r in range(repeats):
        torch.cuda.synchronize()
        if flush is not None:
            flush.zero_()
        torch.cuda._sleep(sleep_cycles)  # the device is busy while the host issues the calls
        if gauge is not None:
            speed.append(gauge.probe())
        starts[r].record()
        h0 = time.perf_counter_ns()
        for _ in range(inner):
            fn(*arg_sets[k % n])
            k += 1
        host.append((time.perf_counter_ns() - h0) / 1e3 / inner)
        ends[r].record()
    torch.cuda.synchronize()
    dev = [s.elapsed_time(e) * 1e3 / inner for s, e in zip(starts, ends, strict=True)]
    raw_us, device_us = quantile(host, 0.1), quantile(dev, 0.5)
    if gauge is None:
        return Latency(max(raw_us, device_us), raw_us, device_us, inner, repeats, raw_us)
    host_us, slowdown = scaled_host(host, speed, gauge.best_us)
    return Latency(max(host_us, device_us), host_us, device_us, inner, repeats, raw_us, slowdown)


def scaled_host(host: Sequence[float], probes: Sequence[float], best_us: float) -> tuple[float, float]:
    """(10th percentile of the host samples, each scaled by ``best_us`` / its own probe; the median of
    probe / ``best_us``): host cost for the host at its fastest, and how much slower it ran."""
    slow = [p / best_us for p in probes]
    return quantile([h / f for h, f in zip(host, slow, strict=True)], 0.1), quantile(slow, 0.5)


def probe(fn: Callable[..., Any], args: Sequence[Any], *, device: str, limit_us: float = math.inf) -> float:
    """The wall time of one call of ``fn(*args)``, us, synchronized before and after: a coarse first
    look, not a measurement (``tileship tune``'s triage). The first call may pay one-time costs (a
    module's first launch), so a first call over ``limit_us`` is repeated and the second one counts."""
    sync = _sync(device)
    us = math.inf
    for _ in range(2):
        sync()
        t0 = time.perf_counter_ns()
        fn(*args)
        sync()
        us = (time.perf_counter_ns() - t0) / 1e3
        if us <= limit_us:
            break
    return us


def _sync(device: str) -> Callable[[], Any]:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


__all__ = ["PROBE_CALLS", "HostGauge", "Latency", "SAMPLE_US", "SLEEP_MARGIN", "latency", "probe", "scaled_host"]


def spin_rate(torch: Any) -> float:
    """Cycles of ``torch.cuda._sleep`` per microsecond on the current device, timed once with CUDA events
    (about 1 ms of device time): what a wanted spin of N microseconds asks ``_sleep`` for."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    return 1_000_000 / max(1e-3, a.elapsed_time(b) * 1e3)
