"""A canary release next to the active one in a running server, and how it ends.

``Rollout`` is the server's canary state (``Service.canary``). ``start`` loads, checks and
warms the canary exactly like a reload prepares a release (``ReleaseHolder.prepare``, under
the same lock, off to the side): a canary that fails to load or warm is refused with the
stage and the reason and the active release keeps serving. While it runs, ``route`` sends a
deterministic share of infer requests to it: request n (counted from the start) goes to the
canary when ``floor(n * P) > floor((n - 1) * P)`` with P as an exact fraction, so any 100
consecutive requests at P = 0.1 send exactly 10 to the canary. ``record`` keeps, per side
(active | canary) and per model, a ring of the last ``canary_stats.RING`` latencies (the operator's
call and its wait for the device, ``canary_stats.op_seconds``: what the release changes, not the queue or
the copies around it) and the request and error counts (5xx, device failures and kernel faults
answered by the reference, reason ``circuit_open``; 4xx and overload are not the release's fault and
are ignored). After each canary request,
and every second, ``serve.canary.decide`` judges the windows; a promote or rollback verdict
completes on its own:

- promote: when the server follows a registry, the registry's active pointer moves to the
  canary (``Registry.activate``, published first if it is not there), then the canary is
  swapped in as the active release (one assignment, as a reload does);
- rollback: the canary stops receiving requests and is dropped; the active release and the
  registry are untouched.

Requests are answered throughout: each one holds the release it started on. A reload that
swaps the active release during a canary aborts it (the comparison lost its baseline).
Every verdict other than a repeated ``wait`` is logged (``canary_decision``) with its numbers
and kept in ``status()`` (the last ``KEEP``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tileship.errors import RegistryError, TileshipError
from tileship.serve.canary import CanaryPolicy, Verdict, decide
from tileship.serve.canary_stats import Window, metrics
from tileship.serve.holder import Served, Target, image_check, release_id_at

if TYPE_CHECKING:
    from tileship.serve.app import Service

KEEP = 50            # decisions kept in the status
TICK_S = 1.0         # how often a running canary is judged without traffic (window_seconds)
ACTIVE, CANARY = "active", "canary"


class Rollout:
    """The canary of one server (at most one at a time). Called on the event loop only."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.state = "none"   # none | loading | running | promoting | promoted | rolled_back | aborted | failed
        self.canary: Served | None = None
        self.base: Served | None = None
        self.policy = CanaryPolicy()
        self.requested: str | None = None
        self.failure: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.decisions: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self._share = Fraction(0)
        self._n = 0
        self._windows = {ACTIVE: Window(), CANARY: Window()}
        self._started = 0.0
        self._ended = 0.0
        self._ticker: asyncio.Task[Any] | None = None
        self.metrics = metrics(service.metrics.registry)

    # -- the request path ----------------------------------------------------------------
    def route(self, current: Served | None, model: str) -> tuple[Served | None, str]:
        """The release this request runs on, and its side. Counter-based: exact shares."""
        can = self.canary
        if self.state != "running" or can is None or current is not self.base:
            return current, ACTIVE
        if model not in can.release.ops and model not in can.models:
            return current, ACTIVE
        self._n += 1
        s = self._share
        if (self._n * s.numerator) // s.denominator > ((self._n - 1) * s.numerator) // s.denominator:
            return can, CANARY
        return current, ACTIVE

    def record(self, side: str, model: str, status: int, seconds: float | None = None,
               reason: str | None = None) -> None:
        """One answered request of ``side``; judges the canary after a canary request."""
        if self.state != "running" or (400 <= status < 500) or status == 503 and reason != "device_failure":
            return
        error = status >= 500 or reason == "circuit_open"
        self._windows[side].add(model, seconds, error)
        self.metrics["requests"].labels(side, model, "error" if error else "ok").inc()
        if side == CANARY:
            self.evaluate(log_wait=False)

    # -- judging -------------------------------------------------------------------------
    def evaluate(self, *, log_wait: bool) -> Verdict | None:
        """Judge the windows now; start completing on promote/rollback. None when not running."""
        if self.state != "running":
            return None
        if self.service.holder.current is not self.base:
            self._finish("aborted", {"reason": "the active release changed (a reload) during the canary"})
            return None
        v = decide(self._windows[ACTIVE].side(), self._windows[CANARY].side(), self.policy,
                   time.monotonic() - self._started)
        for m, row in v.numbers["models"].items():
            if row.get("compared"):
                self.metrics["p50"].labels(ACTIVE, m).set(row["p50_active_ms"] / 1e3)
                self.metrics["p50"].labels(CANARY, m).set(row["p50_canary_ms"] / 1e3)
        if v.action != "wait" or log_wait:
            self._note(v)
        if v.action == "promote":
            self.state = "promoting"  # no more canary requests; completes under the reload lock
            self._spawn(self._promote(v))
        elif v.action == "rollback":
            self._finish("rolled_back", {"reason": "; ".join(v.reasons)})
        return v

    def _note(self, v: Verdict) -> None:
        row = {"at": round(time.time(), 3), **v.to_json()}
        self.decisions.append(row)
        self.metrics["decisions"].labels(v.action).inc()
        self.service.log.event("canary_decision", "warning" if v.action == "rollback" else "info",
                               canary=self._canary_id(), active=self.base.release_id if self.base else None,
                               **v.to_json())

    # -- control -------------------------------------------------------------------------
    async def start(self, release: str, policy: CanaryPolicy) -> tuple[int, dict[str, Any]]:
        """Load, check and warm ``release`` (a release directory or a registry id) and start
        routing ``policy.fraction`` of requests to it. 409 when one runs or it fails to load."""
        svc = self.service
        await svc._loaded.wait()
        if self.state in ("loading", "running", "promoting"):
            return 409, {"result": "refused", "error": f"a canary is already {self.state}: {self.requested}",
                         "hint": "DELETE /v2/tileship/canary to abort it"}
        if svc.holder.current is None or svc.holder.fatal is not None:
            return 409, {"result": "refused", "error": "no active release is serving: nothing to compare a canary with"}
        if svc.workers is not None:
            return 409, {"result": "refused", "error": "a canary is not available with --workers yet",
                         "hint": "run the canary on a server with --workers 0"}
        self._reset(release, policy)
        self.state = "loading"
        async with svc._reload_lock:
            try:
                target = await asyncio.to_thread(self._target, release)
            except Exception as exc:
                return self._failed("resolve", exc)
            svc.log.event("load_start", trigger="canary", source=str(target.path), release=release_id_at(target.path))
            try:
                served = await asyncio.to_thread(svc.holder.prepare, target)
            except Exception as exc:
                return self._failed("load", exc)
            if served.warm.failures:
                detail = "; ".join(f"{s}: {e}" for s, e in sorted(served.warm.failures.items()))
                return self._failed("warmup",
                                    f"warm-up failed for {len(served.warm.failures)} specializations: {detail}")
            if self.state != "loading":  # aborted while it loaded
                return 409, {"result": "aborted", **self.status()}
            cur = svc.holder.current
            assert cur is not None
            missing = sorted({*cur.release.ops, *cur.models} - {*served.release.ops, *served.models})
            if missing:  # promoting it would stop serving them
                return self._failed("resolve", f"the canary does not serve {', '.join(missing)}, which the active "
                                               f"release {cur.release_id} serves")
            if served.release_id == svc.holder.current.release_id:  # type: ignore[union-attr]
                return self._failed("resolve", f"{release} is the release already active ({served.release_id})")
            self.canary, self.base = served, svc.holder.current
        self._started = time.monotonic()
        self.state = "running"
        self._set_info()
        self.metrics["fraction"].set(policy.fraction)
        self._ticker = self._spawn(self._tick())
        svc.log.event("canary_start", canary=served.release_id, active=self.base.release_id if self.base else None,
                      fraction=policy.fraction, policy=asdict(policy), load_s=round(served.load_seconds, 4),
                      warmup_s=round(served.warm.seconds, 4))
        return 200, {"result": "started", **self.status()}

    def abort(self) -> tuple[int, dict[str, Any]]:
        if self.state not in ("loading", "running"):
            return 409, {"result": "refused", "error": f"no canary is running (state {self.state})"}
        self._finish("aborted", {"reason": "aborted by DELETE /v2/tileship/canary"})
        return 200, {"result": "aborted", **self.status()}

    def status(self) -> dict[str, Any]:
        """The canary's state, windows, decisions and outcome (JSON-ready)."""
        w = self._windows
        return {"state": self.state, "requested": self.requested, "canary": self._canary_id(),
                "active": self.base.release_id if self.base else None, "policy": asdict(self.policy),
                "elapsed_s": round((self._ended or time.monotonic()) - self._started, 3) if self._started else 0.0,
                "routed": {s: {"requests": w[s].requests, "errors": w[s].errors, "models": w[s].per_model} for s in w},
                "last_decision": self.decisions[-1] if self.decisions else None, "decisions": list(self.decisions),
                "outcome": self.result, "failure": self.failure}

    def summary(self) -> dict[str, Any] | None:
        """A short form for the readiness body; None when no canary ever ran."""
        if self.state == "none":
            return None
        last = self.decisions[-1]["action"] if self.decisions else None
        return {"state": self.state, "canary": self._canary_id(), "fraction": self.policy.fraction,
                "last_decision": last, **({"failure": self.failure} if self.failure else {})}

    # -- completion ----------------------------------------------------------------------
    async def _promote(self, v: Verdict) -> None:
        svc, can = self.service, self.canary
        assert can is not None
        async with svc._reload_lock:
            registry = None
            try:
                registry = await asyncio.to_thread(self._activate_in_registry, can)
            except TileshipError as exc:
                self._finish("rolled_back", {"reason": f"promotion refused by the registry: {exc.message}",
                                             "hint": exc.hint})
                return
            if svc.holder.current is not self.base:
                self._finish("aborted", {"reason": "the active release changed (a reload) while promoting"})
                return
            old = svc.holder.swap(can)
            m, rel = svc.metrics, can.release
            m.load_seconds.set(can.load_seconds)
            m.warmup_seconds.set(can.warm.seconds)
            m.set_release(rel.release_id, rel.kernel_revision, rel.lock_digest, can.device_label, image_check(rel),
                          evidence=rel.evidence_seal)
            svc.log.event("swap", trigger="canary", release=rel.release_id, previous=old.release_id if old else None,
                          kernel_revision=rel.kernel_revision, registry=registry)
            self._finish("promoted", {"release": rel.release_id, "previous": old.release_id if old else None,
                                      "registry": registry})

    def _activate_in_registry(self, can: Served) -> dict[str, Any] | None:
        """Move the registry's active pointer to the canary when the server follows a registry."""
        src = self.service.holder.source
        if (src / "manifest.json").is_file() or not src.is_dir():
            return None
        from tileship.release.registry import Registry

        reg = Registry(src)
        try:
            rid = reg.resolve(can.release_id)
        except RegistryError:
            rid = reg.publish(can.target.path)
        active = reg.activate(rid, evidence=can.target.evidence)  # what the canary loaded, not newer evidence
        return {"root": str(reg.root), "active": active.release_id, "previous": active.previous}

    def _finish(self, state: str, result: dict[str, Any]) -> None:
        self.state = state
        self._ended = time.monotonic()
        self.result = result
        if state != "promoted" and self.canary is not None:
            self.service.holder.retire(self.canary)  # its snapshot goes once RETIRED_KEEP newer ones exist
        self.canary = None if state != "promoted" else self.canary
        self.metrics["fraction"].set(0)
        self._set_info()
        if self._ticker is not None and self._ticker is not asyncio.current_task():
            self._ticker.cancel()
        self.service.log.event("canary_end", "warning" if state != "promoted" else "info", state=state, **result,
                               canary=self._canary_id(), active=self.base.release_id if self.base else None)

    async def _tick(self) -> None:
        while self.state == "running":
            await asyncio.sleep(TICK_S)
            self.evaluate(log_wait=True)

    # -- helpers ---------------------------------------------------------------------------
    def _reset(self, release: str, policy: CanaryPolicy) -> None:
        self.requested, self.policy = release, policy
        self.canary = self.base = None
        self.failure = self.result = None
        self.decisions.clear()
        self._share = Fraction(policy.fraction).limit_denominator(1_000_000)
        self._n = 0
        self._windows = {ACTIVE: Window(), CANARY: Window()}
        self._started = self._ended = 0.0

    def _target(self, release: str) -> Target:
        """A release directory, or an id (prefix) in the registry the server follows; loaded with its evidence
        pinned as it is now, and promoted into a registry only while it still is (``Registry.activate(evidence=)``)."""
        from tileship.release.evidence_seal import pin

        path = Path(release)
        if (path / "manifest.json").is_file():
            return Target(path, False, pin(path))
        src = self.service.holder.source
        if (src / "manifest.json").is_file() or not src.is_dir():
            raise TileshipError(f"{release!r} is not a release directory, and this server serves {src}, not a registry",
                                hint="give the canary's release directory (one holding manifest.json)")
        from tileship.release.registry import Registry

        reg = Registry(src)
        rid = reg.resolve(release)
        path = reg.path_of(rid)
        return Target(path, False, pin(path), release_id=rid)

    def _failed(self, stage: str, error: BaseException | str) -> tuple[int, dict[str, Any]]:
        msg = error.message if isinstance(error, TileshipError) else (
            f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error)
        hint = error.hint if isinstance(error, TileshipError) else None
        self.state, self.failure = "failed", {"stage": stage, "error": msg, "hint": hint, "at": round(time.time(), 3)}
        svc = self.service
        svc.metrics.load_failures.labels("warmup" if stage == "warmup" else "load").inc()
        serving = svc.holder.current.release_id if svc.holder.current else None
        svc.log.event("load_failed", "error", trigger="canary", source=self.requested, stage=stage, error=msg,
                      hint=hint, serving=serving)
        self._set_info()
        return 409, {"result": "failed", "stage": stage, "error": msg, "hint": hint, "serving": serving}

    def _canary_id(self) -> str | None:
        if self.canary is not None:
            return self.canary.release_id
        return (self.result or {}).get("release") or (release_id_at(Path(self.requested)) if self.requested else None)

    def _set_info(self) -> None:
        self.metrics["info"].info({"state": self.state, "canary": self._canary_id() or "none",
                                   "active": self.base.release_id if self.base else "none"})

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro)
        self.service.background.add(t)
        t.add_done_callback(self.service.background.discard)
        return t

