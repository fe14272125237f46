"""What a canary records (``serve.rollout``): per side a window of latencies per model and the
request and error counts, the worker-thread timer, and the canary's Prometheus metrics."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from tileship.serve.canary import Side

RING = 2048          # latency samples kept per (side, model)


class Timed:
    """A worker job that remembers how long it ran (seconds; None until it returns)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.seconds: float | None = None

    def __call__(self) -> Any:
        t0 = time.perf_counter()
        out = self.job()
        self.seconds = time.perf_counter() - t0
        return out

    async def wrap(self) -> Any:
        """The same for a job that returns an awaitable (run on the event loop)."""
        t0 = time.perf_counter()
        out = await self.job()
        self.seconds = time.perf_counter() - t0
        return out


class DeviceSpan:
    """CUDA events around an operator call, recorded only while a canary compares releases (``on``): the
    device's time from the call's first launch to its last, without the host-to-device copies queued
    before it (the start event waits for them on the stream) or the copy back after it. ``ms`` once the
    stream was synchronized; None when off."""

    def __init__(self, on: bool) -> None:
        self.events: tuple[Any, Any] | None = None
        if on:
            import torch

            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def stop(self) -> None:
        if self.events is not None:
            self.events[1].record()

    def ms(self) -> float | None:
        return None if self.events is None else float(self.events[0].elapsed_time(self.events[1]))


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
        return Side({m: list(v) for m, v in self.latencies.items()}, self.requests, self.errors)


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
