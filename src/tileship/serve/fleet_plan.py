"""Rolling activation across a fleet of replicas: which release each replica serves, and when.

``FleetPlan`` is the fleet's state machine, pure Python with no Ray and no I/O (the Ray actor in
``serve.ray_fleet`` drives it; tests drive it with a fake clock). Replicas ``sync`` every fraction
of a second: they report the version they serve, a load failure if one happened, and the
requests they answered since the last sync; they get back the version they should serve.
A **version** is what a replica loads: a release id with the registry's copy of it and the evidence pin the
pointer recorded (``version_of``: ``<release id>#<digest>``; a bare release id is a version of itself). The same
release in a new copy (``publish --replace``) or re-pinned (activated again) is another version and rolls
like another release, and so is the same copy activated reference-only (``activate --reference``: version
``...+reference``), which skips the canary: the reference is the tested default, and a switch to it is the
way out of a kernel's trouble, so no latency window may refuse it. ``tick(active)`` is called with the
registry's active version; a change starts a roll:

1. **canary**: one replica (the first live one by id) is assigned the new release; it loads and
   warms it off to the side (``Service.reload``) while it keeps answering on the old one, so no
   request fails. A load or warm-up failure (a kernel that raises or disagrees with the
   reference) is an immediate rollback.
2. **judge**: once the canary serves the new release, its requests and those of the other
   replicas (still on the old release) are compared over a window with the rule of
   ``serve.canary.decide`` (error excess at any time; per-operator p50 beyond noise once the
   window is full). ``rollback`` ends the roll; ``promote`` goes on.
3. **roll**: every replica is assigned the new release; the roll is done when every live
   replica serves it (``rolled_s``: seconds from the registry change to fully rolled).

A rollback assigns the old version to the canary again (a replica that failed to load keeps serving what it
served) and, when the refused version is another release than the one before, returns an action
``("registry_rollback", target release id, reason)``: the caller moves the registry's pointer back (when it
still names the refused release) and logs the reason. A refused copy or pin of the release the fleet serves
leaves the pointer alone (``registry_rollback`` false in the event): the registry cannot name the earlier one
(a re-pin is written in place, a replaced copy is gone), so the fleet keeps serving it. A refused version is
not tried again while the registry still names it. Every event is kept (``events``) with its numbers. Requests
are aggregated per release id (``per_release``), whichever replica and version answered them; during a roll of
the same release, the canary's requests and the others' are told apart by the replica that answered them.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tileship.serve.canary import CanaryPolicy, decide
from tileship.serve.canary_stats import RING, Window
from tileship.verify.timing import quantile

KEEP_EVENTS = 200


#: the suffix of a version served reference-only (``activate --reference``): ``is_reference``
REFERENCE = "+reference"


def version_of(release: str, copy: str, evidence: str | None, reference_only: bool = False) -> str:
    """The version of ``release`` served from the registry's copy at ``copy`` with ``evidence`` pinned (None: no
    pin): ``<release id>#<12 hex digits of a sha256 of the copy's path and the pin>``, and ``+reference`` when
    every operator is to serve its PyTorch reference (``reference_only``: a mode change is another version). Pure."""
    digest = hashlib.sha256(f"{copy}\0{evidence or ''}".encode()).hexdigest()[:12]
    return f"{release}#{digest}{REFERENCE if reference_only else ''}"


def is_reference(version: str) -> bool:
    """Whether ``version`` serves every operator on its PyTorch reference (``version_of(..., reference_only=True)``)."""
    return version.endswith(REFERENCE)


def release_of(version: str) -> str:
    """The release id of a version (``version_of``; a bare release id is its own)."""
    return version.partition("#")[0]


def _said(version: str, r: Roll) -> str:
    """``version`` as the reasons of roll ``r`` name it: its release id, unless that would not tell it from the
    roll's other version (a copy or pin of the same release): then the whole version."""
    rid = release_of(version)
    return version if any(release_of(v) == rid for v in {r.target, r.previous} - {version}) else rid


@dataclass(frozen=True)
class FleetPolicy:
    """How a roll is judged and bounded. ``canary``: the comparison rule and its window (its
    ``fraction`` is unused: the canary's share is one replica's share of the traffic)."""

    canary: CanaryPolicy = CanaryPolicy(window_requests=50, window_seconds=5.0)
    load_timeout_s: float = 300.0    # a replica that has not loaded its assigned release by then fails the roll
    stale_s: float = 15.0            # a replica not heard from for this long is dropped from the fleet


@dataclass
class ReplicaState:
    version: str | None = None
    failed: dict[str, str] = field(default_factory=dict)   # version -> why it could not load
    seen: float = 0.0
    node: str = ""


@dataclass
class Roll:
    target: str                     # versions (``version_of``)
    previous: str
    canary: str | None
    started: float
    phase: str = "canary"           # canary -> judge -> roll
    judging_since: float = 0.0
    active: Window = field(default_factory=Window)
    candidate: Window = field(default_factory=Window)


class ReleaseTotals:
    """What one release answered across the fleet: requests, errors, per-operator latency."""

    def __init__(self) -> None:
        self.requests = self.errors = 0
        self.models: dict[str, dict[str, Any]] = {}

    def add(self, model: str, seconds: float, error: bool) -> None:
        self.requests += 1
        self.errors += int(error)
        row = self.models.setdefault(model, {"requests": 0, "errors": 0, "seconds": 0.0, "ring": deque(maxlen=RING)})
        row["requests"] += 1
        row["errors"] += int(error)
        if not error:
            row["seconds"] += seconds
            row["ring"].append(seconds)

    def to_json(self) -> dict[str, Any]:
        models = {}
        for m, r in sorted(self.models.items()):
            ring = list(r["ring"])
            ok = r["requests"] - r["errors"]
            models[m] = {"requests": r["requests"], "errors": r["errors"],
                         "mean_ms": round(r["seconds"] / ok * 1e3, 4) if ok else None,
                         "p50_ms": round(quantile(ring, 0.5) * 1e3, 4) if ring else None,
                         "p95_ms": round(quantile(ring, 0.95) * 1e3, 4) if ring else None}
        return {"requests": self.requests, "errors": self.errors, "models": models}


class FleetPlan:
    """The fleet's state (see the module docstring). Not thread-safe: one caller at a time."""

    def __init__(self, policy: FleetPolicy = FleetPolicy()) -> None:
        self.policy = policy
        self.stable: str | None = None          # versions, as are the roll's and the replicas'
        self.roll: Roll | None = None
        self.refused: str | None = None
        self.replicas: dict[str, ReplicaState] = {}
        self.per_release: dict[str, ReleaseTotals] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=KEEP_EVENTS)
        self.rolls: list[dict[str, Any]] = []   # finished rolls: target, previous, outcome, seconds
        self.seq = 0                            # events numbered from 1 (a reader keeps the last it saw)

    # -- replicas ------------------------------------------------------------------------------
    def assignment(self, replica: str) -> str | None:
        """The version ``replica`` should serve now (None: nothing was ever activated)."""
        r = self.roll
        if r is not None and (r.phase == "roll" or replica == r.canary):
            return r.target
        return self.stable

    def sync(self, replica: str, report: dict[str, Any], now: float) -> str | None:
        """Record a replica's report; return its assignment. ``report``: ``version`` (served now),
        ``failed`` {version: error}, ``samples`` [[model, release id, seconds, error], ...], ``node``."""
        st = self.replicas.setdefault(replica, ReplicaState())
        st.version, st.seen, st.node = report.get("version"), now, str(report.get("node", ""))
        st.failed.update(report.get("failed") or {})
        r = self.roll
        for model, release, seconds, error in report.get("samples") or ():
            self.per_release.setdefault(release, ReleaseTotals()).add(model, float(seconds), bool(error))
            if r is not None and r.phase == "judge":
                if replica == r.canary and release == release_of(r.target):
                    r.candidate.add(model, float(seconds), bool(error))
                elif replica != r.canary and release == release_of(r.previous):
                    r.active.add(model, float(seconds), bool(error))
        return self.assignment(replica)

    def live(self, now: float) -> list[str]:
        """Replica ids heard from within ``stale_s``; forgets the others."""
        for rid in [k for k, v in self.replicas.items() if now - v.seen > self.policy.stale_s]:
            del self.replicas[rid]
            self._event(now, "replica_lost", replica=rid)
        return sorted(self.replicas)

    # -- the roll --------------------------------------------------------------------------------
    def tick(self, active: str | None, now: float) -> list[tuple[str, str, str]]:
        """Advance with the registry's active version (``version_of``); returns actions for the caller:
        ``("registry_rollback", refused release id, reason)``."""
        live = self.live(now)
        if active is None:
            return []
        if self.stable is None:
            self.stable = active
            self._event(now, "stable", release=release_of(active), version=active)
            return []
        if active != self.refused:
            self.refused = None
        r = self.roll
        if r is None:
            if active != self.stable and active != self.refused:
                self._start(active, live, now)
            return []
        if r.phase != "roll" and active != r.target:  # the registry moved on during the canary
            self._end(now, "aborted", f"the registry's active release became {_said(active, r)} during the canary")
            return []
        if r.phase == "canary":
            return self._canary(r, live, now)
        if r.phase == "judge":
            return self._judge(r, live, now)
        return self._rolling(r, live, now)

    def _start(self, target: str, live: list[str], now: float) -> None:
        for st in self.replicas.values():  # an earlier failure to load this version is not this roll's
            st.failed.pop(target, None)
        canary = next((x for x in live if self.replicas[x].version == self.stable), live[0] if live else None)
        self.roll = Roll(target=target, previous=str(self.stable), canary=canary, started=now)
        if is_reference(target):  # the tested default, and an emergency switch: not judged on latency
            self.roll.canary, self.roll.phase = None, "roll"
            self._event(now, "roll_start", **self._names(self.roll), canary=None, replicas=len(live),
                        reason="reference only: every replica switches at once, with no canary")
            return
        self._event(now, "roll_start", **self._names(self.roll), canary=canary, replicas=len(live))
        if canary is None:  # no replica to judge on: every replica that starts loads the new release
            self.roll.phase = "roll"

    def _canary(self, r: Roll, live: list[str], now: float) -> list[tuple[str, str, str]]:
        if r.canary not in live:
            return self._rollback(r, now, f"canary replica {r.canary} was lost before it served {_said(r.target, r)}")
        st = self.replicas[r.canary]
        if r.target in st.failed:
            return self._rollback(r, now, f"canary replica {r.canary} could not load {_said(r.target, r)}: "
                                          f"{st.failed[r.target]}")
        if st.version == r.target:
            r.phase, r.judging_since = "judge", now
            self._event(now, "canary_serving", release=release_of(r.target), version=r.target, replica=r.canary,
                        load_s=round(now - r.started, 3))
        elif now - r.started > self.policy.load_timeout_s:
            return self._rollback(r, now, f"canary replica {r.canary} did not load {_said(r.target, r)} "
                                          f"within {self.policy.load_timeout_s:g} s")
        return []

    def _judge(self, r: Roll, live: list[str], now: float) -> list[tuple[str, str, str]]:
        if r.canary not in live:
            return self._rollback(r, now, f"canary replica {r.canary} was lost while judged")
        verdict = decide(r.active.side(), r.candidate.side(), self.policy.canary, now - r.judging_since)
        if verdict.action == "rollback":
            return self._rollback(r, now, "; ".join(verdict.reasons), verdict=verdict.to_json())
        if verdict.action == "promote":
            r.phase = "roll"
            self._event(now, "canary_promoted", release=release_of(r.target), version=r.target,
                        reasons=list(verdict.reasons), verdict=verdict.to_json())
        return []

    def _rolling(self, r: Roll, live: list[str], now: float) -> list[tuple[str, str, str]]:
        failed = {x: self.replicas[x].failed[r.target] for x in live if r.target in self.replicas[x].failed}
        if failed:
            x, why = sorted(failed.items())[0]
            return self._rollback(r, now, f"replica {x} could not load {_said(r.target, r)} during the roll: {why}")
        if live and all(self.replicas[x].version == r.target for x in live):
            self.stable = r.target
            self._end(now, "rolled", f"{len(live)} replicas serve {_said(r.target, r)}")
        elif now - r.started > self.policy.load_timeout_s + self.policy.canary.window_seconds:
            return self._rollback(r, now, f"not every replica loaded {_said(r.target, r)} within the load timeout")
        return []

    def _rollback(self, r: Roll, now: float, reason: str, **numbers: Any) -> list[tuple[str, str, str]]:
        self.refused = r.target
        other = release_of(r.target) != release_of(r.previous)  # a copy or pin of the same release: no pointer back
        self._end(now, "rolled_back", reason, registry_rollback=other, **numbers)
        return [("registry_rollback", release_of(r.target), reason)] if other else []

    def _end(self, now: float, outcome: str, reason: str, **numbers: Any) -> None:
        r = self.roll
        assert r is not None
        seconds = round(now - r.started, 3)
        self.rolls.append({**self._names(r), "outcome": outcome, "seconds": seconds, "reason": reason})
        self.roll = None
        self._event(now, outcome, **self._names(r), canary=r.canary, seconds=seconds, reason=reason, **numbers)

    @staticmethod
    def _names(r: Roll) -> dict[str, str]:
        """A roll's release ids and versions, as events and records name them."""
        return {"release": release_of(r.target), "version": r.target, "previous": release_of(r.previous),
                "previous_version": r.previous}

    def _event(self, now: float, event: str, **fields: Any) -> None:
        self.seq += 1
        self.events.append({"seq": self.seq, "t": round(now, 3), "event": event, **fields})

    # -- reporting -----------------------------------------------------------------------------------
    def status(self, now: float) -> dict[str, Any]:
        """JSON-ready: the stable release (``version``: its version), the roll in progress, replicas (each one's
        release id and version), the refused version, totals per release id, rolls, events."""
        r = self.roll
        roll = None if r is None else {
            **self._names(r), "canary": r.canary, "phase": r.phase,
            "elapsed_s": round(now - r.started, 3),
            "window": {"active": {"requests": r.active.requests, "errors": r.active.errors},
                       "canary": {"requests": r.candidate.requests, "errors": r.candidate.errors}}}
        return {"stable": release_of(self.stable) if self.stable else None, "version": self.stable, "roll": roll,
                "refused": self.refused,
                "replicas": {k: {"release": release_of(v.version) if v.version else None, "version": v.version,
                                 "node": v.node, "failed": dict(v.failed),
                                 "seen_s_ago": round(now - v.seen, 3) if math.isfinite(v.seen) else None}
                             for k, v in sorted(self.replicas.items())},
                "per_release": {k: v.to_json() for k, v in sorted(self.per_release.items())},
                "rolls": list(self.rolls), "events": list(self.events)}
