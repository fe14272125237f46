"""Hot swap: the release a running server's source names now, loaded and warmed off the event loop, swapped in.

``load_and_swap`` is what ``Service.initial_load`` and ``Service.reload`` run (SIGHUP, the repository
extension's load, ``POST /v2/repository/reload``, a Ray fleet's roll): resolve the source (``holder.resolve``:
a registry's pointer checked), load and warm the release on a worker thread (or take the warm rollback standby),
roll the worker processes with ``--workers``, then swap it in with one assignment (``holder.swap``) and record
it: metrics, one log line, the next rollback standby prewarmed (``standby``). A resolve, load, warm-up or worker
roll that fails leaves the release served serving and is an answer (409), not an exception.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import TYPE_CHECKING, Any

from tileship.serve import standby
from tileship.serve.holder import Target, image_check, release_id_at

if TYPE_CHECKING:
    from tileship.serve.app import Service


async def load_and_swap(service: Service, *, trigger: str, accept_warm_failures: bool) -> tuple[int, dict[str, Any]]:
    """Resolve ``service``'s source and swap in what it names, one reload at a time (``_reload_lock``); returns
    (status, body) for the route or RPC that asked. 200: ``unchanged`` (the release served already), or
    ``swapped`` (its load and warm-up times, the release before it). 409 (``_failed``): resolving, loading, warming
    (unless ``accept_warm_failures``) or rolling the worker processes failed; the release served keeps serving."""
    async with service._reload_lock:
        h = service.holder
        try:
            target: Target = await asyncio.to_thread(h.resolve)
        except Exception as exc:
            return _failed(service, str(h.source), "resolve", exc, trigger)
        rid = release_id_at(target.path)
        if h.unchanged(target, rid):  # a replaced copy (id@n) loads
            service.metrics.reloads.labels("unchanged").inc()
            service.log.event("reload", trigger=trigger, result="unchanged", release=rid)
            return 200, {"result": "unchanged", "release": rid, "reference_only": target.reference_only}
        warm = h.warm(target) if service.workers is None else None
        service.log.event("load_start", trigger=trigger, source=str(target.path), release=rid,
                          reference_only=target.reference_only, warm=warm is not None, evidence=target.evidence)
        if warm is not None:  # a rollback to a release this process holds warm: no load, no warm-up
            served = h.take(warm)
        else:
            try:
                served = await asyncio.to_thread(h.prepare, target)
            except Exception as exc:
                return _failed(service, str(target.path), "load", exc, trigger)
        for sid in served.warm.failures:
            service.metrics.warmup_failures.labels(sid.split(".", 1)[0]).inc()
        if served.warm.failures and not accept_warm_failures:
            detail = "; ".join(f"{s}: {e}" for s, e in sorted(served.warm.failures.items()))
            failed = f"warm-up failed for {len(served.warm.failures)} specializations: {detail}"
            return _failed(service, str(target.path), "warmup", failed, trigger, stage_metric="warmup")
        if service.workers is not None and service.workers.release_id is not None:
            # --workers: the new release's workers start (standby first) while the old ones serve
            try:
                fresh = await asyncio.to_thread(service.workers.roll, target, served.release_id)
            except Exception as exc:
                return _failed(service, str(target.path), "workers", exc, trigger)
            service.workers.switch(fresh, target, served.release_id)
        old = h.swap(served, target.sealed)
        standby.prewarm_rollback(service)
        m = service.metrics
        if warm is None:
            m.load_seconds.set(served.load_seconds)
            m.warmup_seconds.set(served.warm.seconds)
            m.warmup_spec_seconds.clear()  # one release's specializations at a time: bounded labels
            for sid, sec in served.warm.spec_seconds.items():
                m.warmup_spec_seconds.labels(sid).set(sec)
        rel = served.release
        image = image_check(rel)
        m.set_release(rel.release_id, rel.kernel_revision, rel.lock_digest, served.device_label, image,
                      evidence=rel.evidence_seal)
        if image["mismatch"]:
            service.log.event("image_digest_mismatch", "warning", release=rel.release_id, **image)
        ready, body = h.readiness()
        m.ready.set(1 if ready else 0)
        service.log.event("swap" if old is not None else "ready", trigger=trigger, release=rel.release_id,
                          previous=old.release_id if old else None, kernel_revision=rel.kernel_revision,
                          warm=warm is not None,
                          load_s=round(served.load_seconds, 4), warmup_s=round(served.warm.seconds, 4),
                          warmup_calls=served.warm.calls, warmup_threads=served.warm.threads,
                          warmup_slowest=dict(sorted(served.warm.spec_seconds.items(), key=lambda kv: -kv[1])[:3]),
                          warmup_failures=served.warm.failures, reason=body["reason"],
                          notes=list(rel.notes), diagnostics_id=served.diagnostics_id)
        m.reloads.labels("swapped").inc()
        return 200, {"result": "swapped", "release": rel.release_id, "previous": old.release_id if old else None,
                     "reference_only": served.target.reference_only, "warm": warm is not None,
                     "load_seconds": 0.0 if warm else served.load_seconds,
                     "warmup_seconds": 0.0 if warm else served.warm.seconds,
                     "warmup_failures": served.warm.failures}


def _failed(service: Service, source: str, stage: str, error: BaseException | str, trigger: str,
            stage_metric: str = "load") -> tuple[int, dict[str, Any]]:
    """A load that failed at ``stage``: the holder, the metrics and a ``load_failed`` log line record it (with
    the traceback of an error that is not one of tileship's); returns its 409 answer."""
    fail = service.holder.fail(source, stage, error)
    service.metrics.load_failures.labels(stage_metric).inc()
    service.metrics.reloads.labels("failed").inc()
    service.metrics.ready.set(1 if service.holder.readiness()[0] else 0)
    cur = service.holder.current
    tb = None
    if isinstance(error, BaseException) and not hasattr(error, "hint"):  # not one of ours: keep its traceback
        tb = traceback.format_exception(error)
    service.log.event("load_failed", "error", trigger=trigger, source=source, stage=stage, error=fail["error"],
                      hint=fail["hint"], serving=cur.release_id if cur else None,
                      traceback="".join(tb) if tb else None)
    return 409, {"result": "failed", "error": fail["error"], "stage": stage, "hint": fail["hint"],
                 "serving": cur.release_id if cur else None}
