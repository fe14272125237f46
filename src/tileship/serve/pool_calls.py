"""The calls of ``serve.worker_pool.WorkerPool``: take an idle worker of the request's release,
run the call on it, judge what came back.

Two ways in, one contract: ``call`` blocks a request thread; ``acall`` runs on the event loop
(``serve.remote`` uses it for small calls), so the wait for the worker's answer wakes no thread.
Both return (output tensors on the CPU, decision) and raise BadRequest (400 for a bad call, 503
after a failover that could not be retried), WorkerError (500), or ``handoff.QueueTimeout`` (``call`` only:
the request's ``timeout`` passed while it waited for an idle worker; it never ran). What a failed call leads to
is the same for both (``_after_failure``):

- the worker went away (``WorkerDied``): killed from outside, the request is retried once on the
  next worker (inference is idempotent); crashed by itself, a 503 naming the worker and the signal,
  not retried (the request may be what crashed it);
- no answer within ``timeout_s`` (``TimeoutError``): the worker is replaced, the request gets a 503;
- a sticky device fault in the answer: the worker is replaced, the request gets a 503.

``_after_failure`` may wait up to a second for a dead worker's exit status, so ``acall`` runs it on a
thread. A worker is only given back to its idle queue once its answer is in: a call cancelled
mid-flight (the server shutting down) retires its worker instead, since an answer would still come; so does
one cancelled (or closed) before its first step, when ``_rest``'s body never runs (``Rest``).
An ``acall`` cancelled while its thread still waits for a free worker (``Claim``) leaves any worker that
thread takes idle for the next call, never busy for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from tileship.errors import WorkerError
from tileship.runtime.dispatch import Decision
from tileship.serve.handoff import QueueTimeout
from tileship.serve.validate import BadRequest
from tileship.serve.workers import Worker, WorkerDied, ending


class Idle:
    """The serving workers of one release free for a call, oldest first. Used with the pool's lock held: ``pop``
    and ``put`` never wait; a request thread waits on ``ready`` (the same lock) for ``put`` to wake it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.workers: deque[Worker] = deque()
        self.ready = threading.Condition(lock)
        #: threads waiting on ``ready`` (``put`` notifies only when there is one)
        self.waiting = 0

    def put(self, w: Worker) -> None:
        self.workers.append(w)
        if self.waiting:
            self.ready.notify()

    def pop(self) -> Worker | None:
        """The next worker that has not been retired meanwhile, marked busy; None when none is free."""
        while self.workers:
            w = self.workers.popleft()
            if not w.dead:
                w.busy = True
                return w
        return None


class Claim:
    """A wait for a worker on a thread (``_take``) for a caller on the event loop, which may give up meanwhile.
    Both sides touch it only under the pool's lock, so exactly one of them gives back a worker taken for a
    caller that went away: the thread, when it takes one after ``gone`` is set; the caller, when it sets
    ``gone`` after the thread put one in ``worker``."""

    __slots__ = ("gone", "worker")

    def __init__(self) -> None:
        self.gone = False
        self.worker: Worker | None = None


class Rest(Coroutine[Any, Any, tuple[list[Any], Decision]]):
    """What ``acall`` returns: the coroutine ``_rest``, plus what a cancellation before its first step must undo.
    A coroutine cancelled (``throw``) or closed before it started ends at once without running its body, so no
    ``finally`` of ``_rest`` would give back ``acall``'s count or retire the worker sent the call, which would
    stay busy for nobody with an answer still owed. Then ``abandon`` runs, once; afterwards ``_rest`` covers
    itself. A Rest dropped without ever being awaited or closed is abandoned when it is collected: on a thread
    of its own, since a collection may run while this thread holds the pool's lock."""

    __slots__ = ("_coro", "_abandon", "_started")

    def __init__(self, coro: Coroutine[Any, Any, tuple[list[Any], Decision]], abandon: Callable[[], None]) -> None:
        self._coro, self._abandon, self._started = coro, abandon, False

    def _first_step(self) -> None:
        if not self._started:
            self._started = True
            self._abandon()

    def send(self, value: Any) -> Any:
        self._started = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first_step()
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._first_step()
        self._coro.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __del__(self) -> None:
        if not self._started:
            self._started = True
            self._coro.close()  # never started: nothing runs, and no "never awaited" warning
            with contextlib.suppress(RuntimeError):  # interpreter shutdown: no new threads, nothing left to serve
                threading.Thread(target=self._abandon, daemon=True).start()

    def __await__(self) -> Rest:  # type: ignore[override]  # an iterator with send/throw, as await needs
        return self


class PoolCalls:
    """A mixin of ``WorkerPool``: it uses the pool's lock, idle queues, counters and ``_fail``."""

    lock: threading.Lock
    idle: dict[str, Idle]
    inflight: dict[str, int]
    release_id: str | None
    wait_s: float
    timeout_s: float
    retries: int
    _retried: Any
    #: ``WorkerPool._fail``: retire a worker for good (the standby takes its place)
    _fail: Callable[[Worker, str, str], None]
    #: ``WorkerPool.readiness``
    readiness: Callable[[], tuple[bool, str]]

    # -- taking and giving back ----------------------------------------------------------
    def _queue(self, release_id: str) -> Idle:
        q = self.idle.get(release_id)
        if q is None:
            raise BadRequest(503, f"release {release_id} is no longer loaded in the workers (they serve "
                                  f"{self.release_id}); retry")
        return q

    def _take(self, release_id: str, request_deadline: float | None = None, claim: Claim | None = None) -> Worker:
        """An idle worker of ``release_id``, waiting up to ``wait_s`` for one (then a 503), and never past
        ``request_deadline`` (``time.monotonic()``; the request's ``timeout``): then ``QueueTimeout``, the call
        never started. With ``claim`` (``_wait_take``), the worker is also left in ``claim.worker``, unless its
        caller is ``gone``: then the wait ends, a worker taken goes back to the idle queue, and a 503 nobody
        reads is raised."""
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        if request_deadline is not None:
            deadline = min(deadline, request_deadline)
        q = self._queue(release_id)
        with self.lock:
            while (w := q.pop()) is None:
                left = deadline - time.monotonic()
                if left <= 0 or (claim is not None and claim.gone):
                    break
                q.waiting += 1
                try:
                    q.ready.wait(left)
                finally:
                    q.waiting -= 1
            if claim is not None:
                if claim.gone:
                    if w is not None:
                        self._give_back_locked(w)  # the next waiter's
                    raise BadRequest(503, "the call stopped waiting for a worker")
                claim.worker = w
        if w is not None:
            return w
        if request_deadline is not None and deadline == request_deadline:
            raise QueueTimeout(f"timeout: the request waited {(time.monotonic() - t0) * 1e6:.0f} us for a "
                               "worker process, past its parameters.timeout; it was not run")
        raise BadRequest(503, f"no worker is ready: none answered within {self.wait_s:g} s ({self.readiness()[1]})")

    def _take_now(self, release_id: str) -> Worker | None:
        """An idle worker of ``release_id`` if one is free now, else None; never waits."""
        q = self._queue(release_id)
        with self.lock:
            return q.pop()

    def _give_back(self, w: Worker) -> None:
        with self.lock:
            self._give_back_locked(w)

    def _give_back_locked(self, w: Worker) -> None:
        w.busy = False
        q = self.idle.get(w.release)
        if not w.dead and q is not None:
            q.put(w)

    async def _wait_take(self, release_id: str) -> Worker:
        """``_take`` on a thread, for a task on the event loop. When the task stops waiting (cancelled, or the
        thread raised), a worker the thread took or takes later goes back to the idle queue (``Claim``), and
        a thread still waiting is woken to end its wait."""
        claim = Claim()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._take, release_id, None, claim)
        except BaseException:
            with self.lock:
                claim.gone = True
                if claim.worker is not None:
                    self._give_back_locked(claim.worker)
                    claim.worker = None
                if (q := self.idle.get(release_id)) is not None and q.waiting:
                    q.ready.notify_all()  # the others go back to waiting
            raise

    # -- the two ways in -----------------------------------------------------------------
    def call(self, release_id: str, name: str, args: list[Any], out_bytes: int,
             deadline: float | None = None) -> tuple[list[Any], Decision]:
        """Run ``name`` on a worker of ``release_id``, blocking this thread; see the module doc. ``deadline``
        (``time.monotonic()``): the request's own ``timeout``, which bounds the wait for its first worker
        (``QueueTimeout`` past it, never run); a retry after a worker died waits as any call."""
        self._count(release_id, 1)
        try:
            for attempt in (1, 2):
                w = self._take(release_id, deadline if attempt == 1 else None)
                try:
                    reply = w.call(name, args, out_bytes, self.timeout_s)
                except (WorkerDied, TimeoutError) as exc:
                    self._after_failure(w, exc, attempt)  # raises, or returns: retry
                    continue
                except BaseException:
                    self._give_back(w)
                    raise
                return self._answer(w, reply)
            raise AssertionError("unreachable")
        finally:
            self._count(release_id, -1)

    def acall(self, release_id: str, name: str, args: list[Any],
              out_bytes: int) -> Coroutine[Any, Any, tuple[list[Any], Decision]]:
        """``call`` from the event loop, started now: a worker idle now is taken and sent the call before this
        returns, so it runs while the task that awaits the rest is still to be scheduled. Await what it returns
        (the rest: waits for the answer, and for a free worker on a thread only when none was idle); raises
        BadRequest (503) now when ``release_id`` is not loaded."""
        self._count(release_id, 1)
        w: Worker | None = None
        sent: int | WorkerDied | None = None
        try:
            w = self._take_now(release_id)
            if w is not None:
                sent = w._send(name, args, out_bytes, self.timeout_s)
        except WorkerDied as exc:
            sent = exc  # judged by the rest, as a death while waiting would be
        except BaseException:
            if w is not None:
                self._give_back(w)
            self._count(release_id, -1)
            raise
        return Rest(self._rest(release_id, name, args, out_bytes, w, sent), lambda: self._abandon(release_id, w))

    def _abandon(self, release_id: str, w: Worker | None) -> None:
        """``acall``'s rest ended before its first step: undo its count, and retire the worker it sent the call to
        (if any), as a call cancelled mid-flight does: its answer would be read as the next call's."""
        if w is not None:
            threading.Thread(target=self._fail, args=(w, "cancelled", "its call was cancelled before it began"),
                             daemon=True).start()
        self._count(release_id, -1)

    async def _rest(self, release_id: str, name: str, args: list[Any], out_bytes: int, w: Worker | None,
                    sent: int | WorkerDied | None) -> tuple[list[Any], Decision]:
        try:
            for attempt in (1, 2):
                cur = w or self._take_now(release_id)
                if cur is None:
                    cur = await self._wait_take(release_id)
                w = None  # a retry takes another worker
                try:
                    if isinstance(sent, WorkerDied):
                        raise sent
                    reply = await cur.answer(name, args, out_bytes, self.timeout_s, sent)
                except (WorkerDied, TimeoutError) as exc:
                    await asyncio.to_thread(self._after_failure, cur, exc, attempt)
                    sent = None
                    continue
                except asyncio.CancelledError:
                    threading.Thread(target=self._fail, args=(cur, "cancelled", "its call was cancelled mid-flight"),
                                     daemon=True).start()
                    raise
                except BaseException:
                    self._give_back(cur)
                    raise
                return self._answer(cur, reply)
            raise AssertionError("unreachable")
        finally:
            self._count(release_id, -1)

    def _count(self, release_id: str, step: int) -> None:
        with self.lock:
            self.inflight[release_id] = self.inflight.get(release_id, 0) + step

    # -- judging -------------------------------------------------------------------------
    def _after_failure(self, w: Worker, exc: WorkerDied | TimeoutError, attempt: int) -> None:
        """Retire ``w`` after ``exc``; return to retry the request (first death from outside), else raise a 503."""
        if isinstance(exc, TimeoutError):
            self._fail(w, "wedged", f"no answer within {self.timeout_s:g} s")
            raise BadRequest(503, f"worker failure: worker {w.pid} did not answer within {self.timeout_s:g} s and "
                                  "was replaced by the standby") from None
        end = ending(w.proc)
        self._fail(w, "crashed" if end.crashed else "died", f"{exc}: {end.what}")
        if end.crashed:
            raise BadRequest(503, f"worker failure: worker {w.pid} crashed ({end.what}) running this request; "
                                  "not retried, since the request may be what crashed it") from None
        if attempt == 1:
            self.retries += 1
            if self._retried is not None:
                self._retried.inc()
            return
        raise BadRequest(503, f"worker failure: {exc}, twice for this request; retry later") from None

    def _answer(self, w: Worker, reply: dict[str, Any]) -> tuple[list[Any], Decision]:
        """The outputs (copied out of the buffer, which the next call reuses) and the decision, or the
        error the worker answered; gives ``w`` back, or retires it after a sticky fault."""
        if reply.get("fatal"):
            self._fail(w, "sticky_fault", reply["error"])
            raise BadRequest(503, f"device failure on worker {w.pid}: {reply['error']}; the worker exits and the "
                                  "standby serves")
        try:
            if "ok" not in reply:
                if reply["status"] == 500:
                    err = WorkerError(f"worker {w.pid}: {reply['error']}")  # its traceback: logged, never sent
                    err.add_note(f"the worker's traceback:\n{reply.get('traceback') or '(none)'}")
                    raise err
                raise BadRequest(int(reply["status"]), reply["error"])
            outs = [w.buf.view(d, copy=True) for d in reply["outs"]]
        finally:
            self._give_back(w)
        return outs, _decision(reply["decision"])


#: the decisions workers answered, by (path, reason, spec_id): each built once (``_decision``)
_DECISIONS: dict[tuple[str, str, str | None], Decision] = {}


def _decision(fields: list[Any]) -> Decision:
    """The Decision a reply names (``[path, reason, spec_id]``), the same object each time (at most 1024 kept)."""
    key = (fields[0], fields[1], fields[2])
    if (d := _DECISIONS.get(key)) is None:
        if len(_DECISIONS) >= 1024:
            _DECISIONS.clear()
        d = _DECISIONS[key] = Decision(*key)
    return d
