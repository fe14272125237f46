"""The warm rollback standby (issue 16): with a registry source, the state ``tileship rollback``
would return to is loaded and warmed in the background after every swap, so that rollback swaps
a release already in memory instead of loading and warming one (``hot_swap.load_and_swap`` takes
it through ``ReleaseHolder.warm``). Releases swapped out are kept warm the same way
(``holder.RETIRED_KEEP``), so rolling forward again is as quick.

    prewarm_rollback   start it (no-op when off, with worker processes, or while one runs)

Costs: one more loaded release (its kernels, not weights) and its warm-up calls on the device,
which run beside live traffic. ``--no-warm-rollback`` turns it off.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tileship.serve.holder import release_id_at

if TYPE_CHECKING:
    from tileship.serve.app import Service


def prewarm_rollback(service: Service) -> None:
    """Start loading and warming, off the event loop, the state a registry rollback would return
    to (``ReleaseHolder.rollback_target``), unless it is warm already; it becomes the holder's
    standby. Only with ``warm_rollback``, a registry source and no worker processes. A failure is
    logged (``standby_failed``) and changes nothing: that rollback will load as any reload does."""
    if not service.config.warm_rollback or service.workers is not None or service.prewarming is not None:
        return
    service.prewarming = asyncio.get_running_loop().create_task(_prewarm_loop(service))
    service.background.add(service.prewarming)
    service.prewarming.add_done_callback(service.background.discard)


async def _prewarm_loop(service: Service) -> None:
    h = service.holder
    try:
        for _ in range(3):  # the target can move while one loads (another activation): follow it a few times
            try:
                target = await asyncio.to_thread(h.rollback_target)
            except Exception as exc:
                service.log.event("standby_failed", "warning", stage="resolve", error=f"{type(exc).__name__}: {exc}")
                return
            cur = h.current
            if target is None or h.fatal is not None or h.warm(target) is not None or (
                    cur is not None and cur.target == target and cur.release_id == release_id_at(target.path)):
                return
            try:
                served = await asyncio.to_thread(h.prepare, target)
            except Exception as exc:
                service.log.event("standby_failed", "warning", source=str(target.path), stage="load",
                              error=f"{type(exc).__name__}: {exc}")
                return
            if served.warm.failures:
                service.log.event("standby_failed", "warning", source=str(target.path), stage="warmup",
                              error=f"warm-up failed for {sorted(served.warm.failures)}")
                h.retire(served)
                return
            h.keep_standby(served)
            service.log.event("standby_ready", release=served.release_id, reference_only=target.reference_only,
                          load_s=round(served.load_seconds, 4), warmup_s=round(served.warm.seconds, 4))
    finally:
        service.prewarming = None
