"""N serving worker processes and one warm standby, behind ``calls.run`` (``--workers N``).

``calls.execute_remote`` is what ``calls.run`` runs on its request thread instead of the in-process
``calls.execute``: the request's tensors (CPU views of the body) go into an idle serving
worker's shared buffer, one frame goes out and one comes back (``serve.worker_wire``), the
outputs are copied out of the buffer and encoded by the front-end's transport.

Failover. A worker that dies (kill -9 or any exit: end-of-file on its socket during a call, or
the monitor seeing it exit while idle), reports a sticky device fault (it then exits 3), or does
not answer within ``worker_timeout_s`` (it is killed) is replaced at once by the standby,
which is already loaded and warmed; a new standby starts in the background. A death during a
call is judged by how the process ended (``workers.ending``): killed from outside (SIGKILL,
SIGTERM, ...), its request is retried once on the next worker (inference is idempotent); crashed
by itself (SIGSEGV, SIGABRT, ..., a nonzero exit), it is a 503 naming the worker and the signal,
not retried: the request may be what crashed it (and would crash the standby). A second death,
a wedge or a sticky fault is a 503 naming the worker. With no standby ready, a request waits up
to ``wait_s`` for a serving worker, then gets a 503. Readiness: a serving worker is ready.

Hot swap (``roll`` then ``switch``). The new release's workers start one at a time, the new
standby first, while the old ones keep serving; a worker that fails to load fails the reload
(the old workers serve on). ``switch`` (on the event loop, next to the holder's swap) makes
them current; the old serving workers keep answering the requests that started on the old
release and are stopped once none is in flight and ``grace_s`` has passed. Calls are routed
by the release their request started on, so no request fails across a swap; one that
reaches the pool after its release's workers stopped gets a 503 naming both releases.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from tileship.errors import WorkerError
from tileship.serve import gpu_map
from tileship.serve.pool_calls import Idle, PoolCalls
from tileship.serve.workers import Worker

if TYPE_CHECKING:
    from tileship.serve.holder import Target

#: times a worker that failed to start is started again before the pool gives up on it
START_ATTEMPTS = 3


class WorkerPool(PoolCalls):
    """Serving workers (``idle`` holds the ones free for a call), one standby, the monitor."""

    def __init__(self, n: int, options: dict[str, Any], *, log: Any, registry: Any = None, timeout_s: float = 30.0,
                 start_timeout_s: float = 300.0, wait_s: float = 10.0, gpus: tuple[int, ...] = ()) -> None:
        self.n, self.options, self.log, self.gpus = n, options, log, gpus
        self.pending_gpus: list[int | None] = []  # the devices of the workers starting now
        self.timeout_s, self.start_timeout_s, self.wait_s = timeout_s, start_timeout_s, wait_s
        self.lock = threading.Lock()
        self.serving: list[Worker] = []
        self.standby: Worker | None = None
        self.starting = 0
        #: per release: the serving workers free for a call
        self.idle: dict[str, Idle] = {}
        self.target: Target | None = None
        self.release_id: str | None = None
        #: swapped-out releases: their workers (still answering requests that started there), since when
        self.draining: dict[str, tuple[list[Worker], float]] = {}
        self.inflight: dict[str, int] = {}
        self.grace_s = 5.0
        self.failures: dict[str, int] = {}
        self.retries = 0
        self.last_error: str | None = None
        self.last_failover: dict[str, Any] | None = None
        self._closed = threading.Event()
        self._metrics(registry)

    def _metrics(self, registry: Any) -> None:
        if registry is None:
            self._failed = self._retried = None
            return
        from prometheus_client import Counter, Gauge

        g = Gauge("tileship_workers", "Worker processes by state (--workers)", ("state",), registry=registry)
        g.labels("serving").set_function(lambda: len(self.serving))
        g.labels("standby").set_function(lambda: 1 if self.standby is not None else 0)
        g.labels("starting").set_function(lambda: self.starting)
        self._failed = Counter("tileship_worker_failures", "Workers replaced, by reason", ["reason"], registry=registry)
        self._retried = Counter("tileship_worker_retries", "Requests retried on another worker after one died",
                                registry=registry)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, target: Target, release_id: str) -> None:
        """Start N serving workers and the standby on ``target`` (returns at once), and the monitor."""
        self.target, self.release_id = target, release_id
        self.idle[release_id] = Idle(self.lock)
        for _ in range(self.n + 1):
            self._spawn()
        threading.Thread(target=self._monitor, name="tileship-worker-monitor", daemon=True).start()

    def _spawn(self, attempt: int = 1) -> None:
        with self.lock:
            self.starting += 1
        threading.Thread(target=self._start_one, args=(attempt,), name="tileship-worker-start", daemon=True).start()

    def _start_one(self, attempt: int) -> None:
        assert self.target is not None
        t0, w = time.monotonic(), None
        with self.lock:
            live = [x.gpu for x in self.serving] + [self.standby.gpu if self.standby else None] + self.pending_gpus
            gpu = gpu_map.pick(self.gpus, live)
            self.pending_gpus.append(gpu)
        try:
            w = Worker.spawn(self.target, self.options, gpu)
            w.wait_ready(self.start_timeout_s)
            if w.release != self.release_id:
                raise WorkerError(f"worker {w.pid} loaded release {w.release}, the front-end serves {self.release_id}")
        except Exception as exc:
            if w is not None:
                w.kill()
            with self.lock:
                self.starting -= 1
                self.pending_gpus.remove(gpu)
                self.last_error = str(exc)
            self.log.event("worker_start_failed", "error", attempt=attempt, error=str(exc))
            if attempt < START_ATTEMPTS and not self._closed.is_set():
                time.sleep(attempt)
                self._spawn(attempt + 1)
            return
        with self.lock:
            self.starting -= 1
            self.pending_gpus.remove(gpu)
            if self._closed.is_set():
                role = "closed"
            elif len(self.serving) < self.n:
                self.serving.append(w)
                self.idle[w.release].put(w)
                role = "serving"
            elif self.standby is None:
                self.standby, role = w, "standby"
            else:
                role = "surplus"
        if role in ("closed", "surplus"):
            w.stop()
            return
        self.log.event("worker_ready", pid=w.pid, role=role, release=w.release, gpu=w.gpu,
                       start_s=round(time.monotonic() - t0, 3), import_s=round(w.info.get("import_s", 0.0), 4),
                       load_s=round(w.info.get("load_s", 0.0), 4), warmup_s=round(w.info.get("warm_s", 0.0), 4))

    def _monitor(self) -> None:
        """Replace workers that exit while nobody is talking to them (an idle one, the standby);
        stop the workers of a swapped-out release once nothing runs on it."""
        while not self._closed.wait(0.05):
            with self.lock:
                old = [w for ws, _ in self.draining.values() for w in ws]
                gone = [w for w in [*self.serving, self.standby, *old] if w is not None and not w.busy and not w.dead
                        and w.proc.poll() is not None]
                done = [rid for rid, (_, since) in self.draining.items()
                        if not self.inflight.get(rid) and time.monotonic() - since > self.grace_s]
                stop = [w for rid in done for w in self.draining.pop(rid)[0]]
                for rid in done:
                    self.idle.pop(rid, None)
            for w in gone:
                self._fail(w, "exited", f"exited with status {w.proc.returncode} while idle")
            for w in stop:
                w.dead = True
                w.stop()
            if done:
                self.log.event("workers_retired", releases=done, pids=[w.pid for w in stop])

    def _fail(self, w: Worker, reason: str, detail: str) -> None:
        """Retire ``w`` for good: the standby takes its place, a new standby starts. Idempotent."""
        t0 = time.monotonic()
        with self.lock:
            if w.dead:
                return
            w.dead = True
            promoted = None
            for ws, _ in self.draining.values():
                if w in ws:
                    ws.remove(w)
            if w is self.standby:
                self.standby = None
            elif w in self.serving:
                self.serving.remove(w)
                if self.standby is not None:
                    promoted, self.standby = self.standby, None
                    self.serving.append(promoted)
                    self.idle[promoted.release].put(promoted)
        w.kill()
        if self._failed is not None:
            self._failed.labels(reason).inc()
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_failover = {"pid": w.pid, "reason": reason, "detail": detail,
                              "promoted": promoted.pid if promoted else None, "at": round(time.time(), 3)}
        self.log.event("worker_failed", "error", pid=w.pid, reason=reason, detail=detail,
                       promoted=promoted.pid if promoted else None, ms=round((time.monotonic() - t0) * 1e3, 3))
        if not self._closed.is_set():
            self._spawn()

    def close(self) -> None:
        self._closed.set()
        with self.lock:
            workers = [*self.serving, *([self.standby] if self.standby else []),
                       *(w for ws, _ in self.draining.values() for w in ws)]
            self.serving, self.standby, self.draining = [], None, {}
        for w in workers:
            w.stop()

    # -- hot swap ------------------------------------------------------------------------
    def roll(self, target: Target, release_id: str) -> list[Worker]:
        """Start the workers of a new release one at a time (the standby first) while the old ones
        serve; returns them (standby first) for ``switch``. Raises WorkerError, stopping the
        ones it started, when one cannot load or loads another release."""
        fresh: list[Worker] = []
        try:
            for _ in range(self.n + 1):
                w = Worker.spawn(target, self.options, gpu_map.pick(self.gpus, [x.gpu for x in fresh]))
                fresh.append(w)
                w.wait_ready(self.start_timeout_s)
                if w.release != release_id:
                    raise WorkerError(f"worker {w.pid} loaded release {w.release}, the front-end prepared {release_id}")
                self.log.event("worker_ready", pid=w.pid, role="standby" if len(fresh) == 1 else "serving",
                               release=w.release, rolling=True, load_s=round(w.info.get("load_s", 0.0), 4))
        except Exception:
            for w in fresh:
                w.kill()
            raise
        return fresh

    def switch(self, fresh: list[Worker], target: Target, release_id: str) -> None:
        """Make ``fresh`` (from ``roll``) the current workers; the old serving ones drain, the old
        standby stops. Call on the event loop, right next to the holder's swap."""
        with self.lock:
            old_id, old_serving, old_standby = self.release_id, self.serving, self.standby
            self.standby, self.serving = fresh[0], fresh[1:]
            q = self.idle[release_id] = Idle(self.lock)
            for w in self.serving:
                q.put(w)
            self.target, self.release_id = target, release_id
            if old_id is not None and old_id != release_id:
                self.draining[old_id] = (old_serving, time.monotonic())
        if old_standby is not None:
            old_standby.dead = True
            threading.Thread(target=old_standby.stop, daemon=True).start()
        self.log.event("workers_swapped", release=release_id, previous=old_id, serving=[w.pid for w in self.serving],
                       standby=fresh[0].pid, draining=[w.pid for w in old_serving])

    def readiness(self) -> tuple[bool, str]:
        with self.lock:
            n, standby, starting = len(self.serving), self.standby is not None, self.starting
        if n:
            return True, f"{n} of {self.n} workers serving, standby {'ready' if standby else 'starting'}"
        why = f"no worker is ready ({starting} starting)"
        return False, why + (f"; last start failure: {self.last_error}" if self.last_error else "")

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"workers": self.n, "release": self.release_id, "serving": [w.pid for w in self.serving],
                    "draining": {rid: [w.pid for w in ws] for rid, (ws, _) in self.draining.items()},
                    "standby": self.standby.pid if self.standby else None, "starting": self.starting,
                    "failures": dict(self.failures), "retries": self.retries, "last_failover": self.last_failover,
                    "gpus": {w.pid: w.gpu for w in [*self.serving, self.standby] if w is not None}}
