"""What a canary records (``serve.rollout``): per side a window of latencies per model and the
request and error counts, the worker-thread timer, and the canary's Prometheus metrics."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import Any

from tileship.serve.canary import Side
from tileship.verify.latency import spin_rate

RING = 2048          # latency samples kept per (side, model)


class Timed:
    """A worker job that remembers when it started (``time.perf_counter``) and how long it ran (seconds; None
    until it returns)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.started: float | None = None
        self.seconds: float | None = None

    def __call__(self) -> Any:
        t0 = self.started = time.perf_counter()
        out = self.job()
        self.seconds = time.perf_counter() - t0
        return out

    def wrap(self, answered: asyncio.Future[Any] | None = None) -> Coroutine[Any, Any, Any]:
        """The same for a job that returns an awaitable (run on the event loop): the job is called now (what it
        does before its first wait happens here), the coroutine returned awaits the rest. With ``answered``,
        the coroutine also sets that future's result (unless it is done) as soon as the job's result is in: a
        waiter on it resumes a turn of the loop before one on the task's own done callbacks would."""
        t0 = self.started = time.perf_counter()
        return self._rest(self.job(), t0, answered)

    async def _rest(self, pending: Awaitable[Any], t0: float, answered: asyncio.Future[Any] | None) -> Any:
        out = await pending
        self.seconds = time.perf_counter() - t0
        if answered is not None and not answered.done():
            answered.set_result(out)
        return out


GATE_US = (200.0, 2000.0)  # the bounds of how long a canary span holds the device while the host queues the work
_rate: list[float] = []  # the device's spin cycles per microsecond, measured once per process
_queued: deque[float] = deque(maxlen=16)  # the last spans' queuing times (us), stalled ones included


def gate_us() -> float:
    """Twice the median queuing time of the last spans, within ``GATE_US``: on the H200 host the same queuing
    took 25-40 us with the device busy and 250-330 us after 20 ms idle, the host's own calls slowed (round 22,
    ``benchmarks/dev/span_probe.py``): a fixed gate either stalls every call of a lightly loaded server or
    holds every call of a busy one longer than it needs."""
    recent = sorted(_queued)
    return GATE_US[0] if not recent else min(GATE_US[1], max(GATE_US[0], 2 * recent[len(recent) // 2]))


class DeviceSpan:
    """The device's time of one operator call's own work, recorded only while a canary compares releases
    (``on``); the dispatcher calls ``start`` and ``stop`` around the call's launches (``Dispatcher.call``'s
    ``span``), before its non-finite check synchronizes.

    Two CUDA events around launches time the work only if the device is busy from the first event to the
    last: on an idle device the first event completes as it is queued, and every host delay before the
    first launch (routing, the GIL, a thread switch) is counted as the operator's (0.29 ms measured for a
    20-45 us GEMM on the H200, round 21). So ``start`` first queues a spin of ``GATE_US`` on the stream
    (``torch.cuda._sleep``, ``gate_us()``): the device reaches the first event only after the host has queued
    the launches and the last event, unless queuing took longer than the gate. A call whose queuing took more
    than 0.8 of its gate gives no sample: ``ms()`` None, ``stalled`` True. ``ms()`` once the stream was
    synchronized. Calls of other threads queued on the same stream inside a span are counted in it."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.events: tuple[Any, Any] | None = None
        self.queued_s: float | None = None
        self.gate_us = GATE_US[0]
        self._t0 = 0.0

    def start(self) -> None:
        if not self.on:
            return
        import torch

        try:
            if not _rate:
                _rate.append(spin_rate(torch))
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.gate_us = gate_us()
            self._t0 = time.perf_counter()
            torch.cuda._sleep(int(self.gate_us * _rate[0]))
            events[0].record()
        except (AttributeError, RuntimeError):  # no spin in this torch (a private API), or the device failed:
            return  # no span (the call itself meets a device failure and answers for it)
        self.events = events

    def stop(self) -> None:
        if self.events is not None:
            self.events[1].record()
            self.queued_s = time.perf_counter() - self._t0
            _queued.append(self.queued_s * 1e6)

    @property
    def stalled(self) -> bool:
        return self.queued_s is not None and self.queued_s * 1e6 > 0.8 * self.gate_us

    def ms(self) -> float | None:
        if self.events is None or self.queued_s is None or self.stalled:
            return None
        return float(self.events[0].elapsed_time(self.events[1]))

    def note(self, spans: dict[str, Any]) -> None:
        """Into a request's spans: ``device_ms``, or ``device_stalled`` (no sample) with the queuing time."""
        if (ms := self.ms()) is not None:
            spans["device_ms"] = round(ms, 4)
        elif self.stalled:
            spans["device_stalled_ms"] = round((self.queued_s or 0.0) * 1e3, 3)


class Window:
    def __init__(self) -> None:
        self.latencies: dict[str, deque[float]] = {}
        self.requests = 0
        self.errors = 0
        self.per_model: dict[str, dict[str, int]] = {}

    def add(self, model: str, seconds: float | None, error: bool) -> None:
        self.requests += 1
        self.errors += int(error)
        row = self.per_model.setdefault(model, {"requests": 0, "errors": 0})
        row["requests"] += 1
        row["errors"] += int(error)
        if seconds is not None and not error:
            self.latencies.setdefault(model, deque(maxlen=RING)).append(seconds)

    def side(self) -> Side:
        return Side({m: list(v) for m, v in self.latencies.items()}, self.requests, self.errors,
                    frozenset(m for m, r in self.per_model.items() if r["requests"] > r["errors"]))


def metrics(registry: Any) -> dict[str, Any]:
    """The canary's metrics, in the server's registry (``release`` is "active" or "canary")."""
    from prometheus_client import Counter, Gauge, Info

    return {
        "requests": Counter("tileship_canary_requests", "Requests judged during a canary, by side and outcome",
                            ("release", "model", "outcome"), registry=registry),
        "p50": Gauge("tileship_canary_p50_seconds", "Median operator-call latency in the canary window",
                     ("release", "model"), registry=registry),
        "fraction": Gauge("tileship_canary_fraction", "Share of requests sent to the canary (0: none running)",
                          registry=registry),
        "decisions": Counter("tileship_canary_decisions", "Canary verdicts logged, by action", ("action",),
                             registry=registry),
        "info": Info("tileship_canary", "The canary: state, canary and active release ids", registry=registry),
    }


def op_seconds(plan: Any, job_s: float | None) -> float | None:
    """What a canary compares for one answered request: the operator's own time, where ``execute`` recorded
    it: on a GPU the device's time between CUDA events around the call (``device_ms``), else its launch and the
    wait for the device (``call_ms`` + ``sync_ms``); without spans the whole job's. The rest of the job (tensors
    to and from the device, encoding) is the same code for either release: on the H200 a 4096x4096 GEMM
    request's job was 1.4 ms, most of it copying its 32 MiB input to the device, and a tile slower by 80 us
    moved it 3.5% (round 20); launch plus wait still held the input copy's tail (the wait), 0.25 ms against a
    30 us slower tile, 1.13x under a 1.25x limit (round 21); events around the call held host delays too,
    0.29 ms for a 20-45 us GEMM (round 21): ``DeviceSpan`` gates the device now."""
    spans = getattr(plan, "spans", None)
    if spans and "device_stalled_ms" in spans:
        return None  # on a GPU, no sample rather than one with host time in it (``DeviceSpan``)
    if spans and "device_ms" in spans:
        return float(spans["device_ms"]) / 1e3
    if spans and "call_ms" in spans and "sync_ms" in spans:
        return (spans["call_ms"] + spans["sync_ms"]) / 1e3
    return job_s
