"""N serving worker processes and one warm standby, behind ``calls.run`` (``--workers N``).

``execute_remote`` is what ``calls.run`` runs on its request thread instead of the in-process
``calls.execute``: the request's tensors (CPU views of the body) go into an idle serving
worker's shared buffer, one frame goes out and one comes back (``serve.worker_wire``), the
outputs are copied out of the buffer and encoded by the front-end's transport.

Failover. A worker that dies (kill -9 or any exit: end-of-file on its socket during a call, or
the monitor seeing it exit while idle), reports a sticky device fault (it then exits 3), or does
not answer within ``worker_timeout_s`` (it is killed) is replaced at once by the standby,
which is already loaded and warmed; a new standby starts in the background. The request that
was on a worker that died is retried once on the next worker (inference is idempotent); a
second death, a wedge or a sticky fault is a 503 naming the worker. With no standby ready, a
request waits up to ``wait_s`` for a serving worker, then gets a 503. Readiness: at least one
serving worker is ready.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from tileship.errors import WorkerError
from tileship.runtime.dispatch import Decision
from tileship.serve.validate import BadRequest
from tileship.serve.workers import Raw, Worker, WorkerDied

#: times a worker that failed to start is started again before the pool gives up on it
START_ATTEMPTS = 3


class WorkerPool:
    """Serving workers (``idle`` holds the ones free for a call), one standby, the monitor."""

    def __init__(self, n: int, options: dict[str, Any], *, log: Any, registry: Any = None, timeout_s: float = 30.0,
                 start_timeout_s: float = 300.0, wait_s: float = 10.0) -> None:
        self.n, self.options, self.log = n, options, log
        self.timeout_s, self.start_timeout_s, self.wait_s = timeout_s, start_timeout_s, wait_s
        self.lock = threading.Lock()
        self.serving: list[Worker] = []
        self.standby: Worker | None = None
        self.starting = 0
        self.idle: queue.Queue[Worker] = queue.Queue()
        self.target: tuple[str, bool] | None = None
        self.release_id: str | None = None
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
        self._failed = Counter("tileship_worker_failures", "Workers replaced, by reason", ("reason",),
                               registry=registry)
        self._retried = Counter("tileship_worker_retries", "Requests retried on another worker after one died",
                                registry=registry)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, path: str, reference_only: bool, release_id: str) -> None:
        """Start N serving workers and the standby on ``path`` (returns at once), and the monitor."""
        self.target, self.release_id = (path, reference_only), release_id
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
        try:
            w = Worker.spawn(*self.target, self.options)
            w.wait_ready(self.start_timeout_s)
            if w.release != self.release_id:
                raise WorkerError(f"worker {w.pid} loaded release {w.release}, the front-end serves {self.release_id}")
        except Exception as exc:
            if w is not None:
                w.kill()
            with self.lock:
                self.starting -= 1
                self.last_error = str(exc)
            self.log.event("worker_start_failed", "error", attempt=attempt, error=str(exc))
            if attempt < START_ATTEMPTS and not self._closed.is_set():
                time.sleep(attempt)
                self._spawn(attempt + 1)
            return
        with self.lock:
            self.starting -= 1
            if self._closed.is_set():
                role = "closed"
            elif len(self.serving) < self.n:
                self.serving.append(w)
                self.idle.put(w)
                role = "serving"
            elif self.standby is None:
                self.standby, role = w, "standby"
            else:
                role = "surplus"
        if role in ("closed", "surplus"):
            w.stop()
            return
        self.log.event("worker_ready", pid=w.pid, role=role, release=w.release, start_s=round(time.monotonic() - t0, 3),
                       load_s=round(w.info.get("load_s", 0.0), 4), warmup_s=round(w.info.get("warm_s", 0.0), 4))

    def _monitor(self) -> None:
        """Replace workers that exit while nobody is talking to them (an idle one, the standby)."""
        while not self._closed.wait(0.05):
            with self.lock:
                gone = [w for w in [*self.serving, self.standby] if w is not None and not w.busy and not w.dead
                        and w.proc.poll() is not None]
            for w in gone:
                self._fail(w, "exited", f"exited with status {w.proc.returncode} while idle")

    def _fail(self, w: Worker, reason: str, detail: str) -> None:
        """Retire ``w`` for good: the standby takes its place, a new standby starts. Idempotent."""
        t0 = time.monotonic()
        with self.lock:
            if w.dead:
                return
            w.dead = True
            promoted = None
            if w is self.standby:
                self.standby = None
            elif w in self.serving:
                self.serving.remove(w)
                if self.standby is not None:
                    promoted, self.standby = self.standby, None
                    self.serving.append(promoted)
                    self.idle.put(promoted)
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
            workers = [*self.serving, *([self.standby] if self.standby else [])]
            self.serving, self.standby = [], None
        for w in workers:
            w.stop()

    # -- calls ---------------------------------------------------------------------------
    def _take(self) -> Worker:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                w = self.idle.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BadRequest(503, f"no worker is ready: none answered within {self.wait_s:g} s "
                                      f"({self.readiness()[1]})") from None
            with self.lock:
                if not w.dead:
                    w.busy = True
                    return w

    def _give_back(self, w: Worker) -> None:
        with self.lock:
            w.busy = False
            if not w.dead:
                self.idle.put(w)

    def call(self, name: str, args: list[Any], out_bytes: int) -> tuple[list[Any], Decision]:
        """Run ``name`` on a serving worker; (output tensors on the CPU, decision). Raises BadRequest
        (400 for a bad call, 503 after a failover that could not be retried), WorkerError (500)."""
        for attempt in (1, 2):
            w = self._take()
            try:
                reply = w.call(name, args, out_bytes, self.timeout_s)
            except WorkerDied as exc:
                self._fail(w, "died", str(exc))
                if attempt == 1:
                    self.retries += 1
                    if self._retried is not None:
                        self._retried.inc()
                    continue
                raise BadRequest(503, f"worker failure: {exc}, twice for this request; retry later") from None
            except TimeoutError:
                self._fail(w, "wedged", f"no answer within {self.timeout_s:g} s")
                raise BadRequest(503, f"worker failure: worker {w.pid} did not answer within {self.timeout_s:g} s and "
                                      "was replaced by the standby") from None
            except BaseException:
                self._give_back(w)
                raise
            if reply.get("fatal"):
                self._fail(w, "sticky_fault", reply["error"])
                raise BadRequest(503, f"device failure on worker {w.pid}: {reply['error']}; the worker exits and the "
                                      "standby serves")
            try:
                if "ok" not in reply:
                    if reply["status"] == 500:
                        raise WorkerError(f"worker {w.pid}: {reply['error']}", hint=reply.get("traceback"))
                    raise BadRequest(int(reply["status"]), reply["error"])
                outs = [w.buf.view(d, copy=True) for d in reply["outs"]]  # the buffer is reused by the next call
            finally:
                self._give_back(w)
            path, reason, spec = reply["decision"]
            return outs, Decision(path, reason, spec)
        raise AssertionError("unreachable")

    def readiness(self) -> tuple[bool, str]:
        with self.lock:
            n, standby, starting = len(self.serving), self.standby is not None, self.starting
        if n:
            return True, f"{n} of {self.n} workers serving, standby {'ready' if standby else 'starting'}"
        why = f"no worker is ready ({starting} starting)"
        return False, why + (f"; last start failure: {self.last_error}" if self.last_error else "")

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"workers": self.n, "serving": [w.pid for w in self.serving],
                    "standby": self.standby.pid if self.standby else None, "starting": self.starting,
                    "failures": dict(self.failures), "retries": self.retries, "last_failover": self.last_failover}


def execute_remote(service: Any, served: Any, name: str, plan: Any, kserve_id: str | None,
                   encode: Any) -> tuple[Any, Decision]:
    """``calls.execute`` for ``--workers N``: same contract, the call runs in a worker process."""
    from tileship.serve import protocol
    from tileship.serve.calls import _parameters

    pool: WorkerPool = service.workers
    rel = served.release
    if rel.release_id != pool.release_id:
        raise BadRequest(503, f"release {rel.release_id} is not loaded in the workers (they serve {pool.release_id})")
    decl = rel.declarations[name]
    args = [protocol.to_tensor(inp, "cpu").item() if i in plan.scalars
            else Raw(inp.raw, list(inp.shape), protocol.DATATYPES[inp.datatype]) if inp.raw is not None
            else protocol.to_tensor(inp, "cpu") for i, inp in enumerate(plan.inputs)]
    outs, decision = pool.call(name, args, sum(protocol.output_bytes(decl, plan).values()))
    out_names = [n for n, _ in decl["outputs"]]
    outputs = [(n, outs[out_names.index(n)], binary) for n, binary in plan.outputs]
    return encode(model=name, version=rel.release_id, request_id=kserve_id, parameters=_parameters(served, decision),
                  outputs=outputs, allow_nonfinite=plan.allow_nonfinite), decision
