"""The options of one ``tileship tune`` run (``tileship.verify.tune``; the CLI's flags map onto them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TuneOptions:
    seeds: tuple[int, ...] = (0, 1)
    #: measured ms per timing run of one path (each path runs ``rounds`` times per point)
    budget_ms: float = 40.0
    warmup_ms: float = 10.0
    min_repeats: int = 5
    max_repeats: int = 40
    rounds: int = 5
    #: more rounds for a bucket whose reference was kept only by the noise band (0: never)
    confirm_rounds: int = 5
    #: overwrite a cache-sized buffer before every timing sample
    flush: bool = True
    #: how a path is timed: "latency" (``verify.latency``: max(host issue cost, device time), each
    #: measured apart: stable where the host's speed moves) or "events" (``timing.measure``: calls
    #: back to back between CUDA events, which read whichever of the two is larger at that moment)
    clock: str = "latency"
    #: with the latency clock on CUDA: host costs scaled to the host at its fastest (``latency.HostGauge``);
    #: off by default: on the H200 host it decided no better than the raw host time (round 16)
    host_gauge: bool = False
    #: prune a candidate at a bucket where one probe call takes more than this many times the
    #: reference's (``tune_rule.triage``; 0: never)
    prune: float = 3.0
    #: cap on the sizes of a T.dynamic dim (None: up to the declared maximum)
    limit: int | None = None
    #: operator -> extra bucket points for its dynamic dim (besides powers of two and the edges)
    buckets: Mapping[str, Sequence[int]] = field(default_factory=dict)
    #: operator names or group ids to tune (empty: all)
    only: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cuda", "cpu")
    on_group: Callable[[str, dict[str, Any]], None] | None = None


__all__ = ["TuneOptions"]
