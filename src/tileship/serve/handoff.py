"""How ``calls.run`` hands an admitted call to what runs it, and waits for the answer.

Three ways, one contract (encoded response and decision back; BadRequest, Fatal or a bug raised):

- **thread**: ``Slots.submit`` runs the call on a request thread (``calls.execute``, or
  ``remote.execute_remote`` with ``--workers N``); ``outcome`` waits for it.
- **loop**: with ``--workers N``, a small call talks to its worker from the event loop
  (``remote.execute_remote_async``, ``Slots.admit``); ``outcome`` waits for the task.
- **inline**: in process, a small call that ``Inline`` has seen served by a compiled kernel in at
  most ``limit_s`` runs on the event loop itself (``Slots.run``). Handing such a call to a thread
  and back costs more than the call (110-160 us on a 2-core machine, against tens of us for the
  call), and the loop would only wait meanwhile. The price: a call that runs inline cannot be
  answered 504 while it runs, and the loop serves nothing else for that long. So only keys whose
  last call took at most ``limit_s`` on a kernel qualify, and one slower call (or one that fails
  with a bug) sends its key back to the thread. References never run inline: a Python reference
  may take as long as its data makes it.

``outcome`` waits with one future, woken by the call's own completion or by a timer
(``TimeoutError`` past the request timeout), never cancelling a call that has started: a call that
outlives its request keeps its slot (and its worker) until it ends. A second timer is the request's
own queue deadline (Triton's ``timeout`` parameter, ``serve.request_params``): a thread's call that has
not started by then is dropped (``QueueTimeout``), its slot freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tileship.runtime.decision import KERNEL, Decision

#: keys ``Inline`` remembers; past it, it forgets them all and learns again (the first calls go to a thread)
MAX_KEYS = 1024


class QueueTimeout(TimeoutError):
    """A thread's call dropped before it started: its request's queue deadline passed while it waited."""


async def outcome(fut: Any, timeout_s: float, queue_s: float = 0.0,
                  answered: asyncio.Future[Any] | None = None) -> Any:
    """The result of ``fut`` (a ``concurrent.futures.Future`` from a request thread, or an asyncio
    task); raises what it raised, TimeoutError past ``timeout_s``, and ``QueueTimeout`` when a thread's
    call has not started ``queue_s`` (> 0; 0: no such deadline) after this call (it is dropped, never run).
    On a timeout or a cancellation a thread's call that has not started is dropped; one that runs, and a
    task, run on. ``answered``: a future the task sets itself when its result is in (``Timed.wrap``), waited
    on instead of one set from the task's done callback, a turn of the loop later."""
    loop = asyncio.get_running_loop()
    out = answered if answered is not None else loop.create_future()

    def settle(f: Any) -> None:
        exc = None if f.cancelled() else f.exception()  # retrieved even when nobody waits any more
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result())

    def from_thread(f: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody waits
            loop.call_soon_threadsafe(settle, f)

    def expire() -> None:
        if not out.done():
            out.set_exception(TimeoutError())

    def expire_queued() -> None:
        if not out.done() and fut.cancel():  # True only for a call no thread has started: it never runs
            out.set_exception(QueueTimeout(f"timeout: the request waited {queue_s * 1e6:.0f} us for a worker "
                                           "thread, past its parameters.timeout; it was not run"))

    thread = not isinstance(fut, asyncio.Future)
    fut.add_done_callback(from_thread if thread else settle)
    timers = [loop.call_at(loop.time() + timeout_s, expire)]
    if thread and 0 < queue_s < timeout_s:
        timers.append(loop.call_at(loop.time() + queue_s, expire_queued))
    try:
        return await out
    except (TimeoutError, asyncio.CancelledError):
        if thread:
            fut.cancel()  # only a call still queued is dropped
        raise
    finally:
        for timer in timers:
            timer.cancel()


class Inline:
    """The calls that run on the event loop in process (see the module doc). Used on the loop only."""

    def __init__(self, limit_s: float, max_keys: int = MAX_KEYS) -> None:
        self.limit_s, self.max_keys = limit_s, max_keys
        #: the keys whose last call a kernel served within ``limit_s``
        self.known: set[tuple[Any, ...]] = set()

    @staticmethod
    def key(release_id: str, name: str, plan: Any) -> tuple[Any, ...]:
        """What decides a call's route and cost: release, operator, dtype and dims."""
        return release_id, name, plan.dtype, tuple(plan.dims.items())

    def fits(self, key: tuple[Any, ...]) -> bool:
        return key in self.known

    def record(self, key: tuple[Any, ...], seconds: float | None, decision: Decision) -> None:
        """After a call of ``key`` answered: keep it if a kernel served it within ``limit_s``, else forget it."""
        if seconds is None or decision.path != KERNEL or seconds > self.limit_s:
            self.known.discard(key)
            return
        if key not in self.known and len(self.known) >= self.max_keys:
            self.known.clear()
        self.known.add(key)

    def drop(self, key: tuple[Any, ...]) -> None:
        """Forget ``key`` (its call failed with a bug): its next calls go to a thread."""
        self.known.discard(key)
