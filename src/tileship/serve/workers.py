"""One worker process of ``tileship serve --workers N``, as the front-end sees it (``Worker``).

``Worker.spawn`` starts ``python -m tileship.serve.worker FD`` with its end of a socketpair and
a fresh shared buffer, ``wait_ready`` waits for its release to be loaded and warmed, ``call``
writes a request's tensors into the buffer and exchanges one frame each way
(``serve.worker_wire``; ``acall`` does the same from the event loop); a worker that closes its
socket mid-call raises ``WorkerDied``, one that does not answer in time ``TimeoutError``.
``ending`` reads how a dead worker ended: killed from outside, or crashed by itself (then the
request it ran may be the cause). The pool (``serve.worker_pool``) decides what follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from tileship.errors import WorkerError
from tileship.serve import gpu_map
from tileship.serve import worker_wire as wire

if TYPE_CHECKING:
    from tileship.serve.holder import Target

#: first size of a worker's shared buffer; it grows to fit the largest call seen
BUFFER_BYTES = 1 << 20


#: a process stopped from outside (kill -9, the OOM killer, a supervisor, Ctrl-C): not the request's doing
KILLED = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
#: a process that faulted by itself (a bad memory access, an abort, a trap): the request may be the cause
CRASHED = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS,
                     signal.SIGTRAP})


class WorkerDied(Exception):
    """The worker went away during the call (its answer will never come)."""


class Ending(NamedTuple):
    """How a worker process ended (``ending``)."""

    #: by its own fault (a CRASHED signal, a nonzero exit status): the request it ran may be what did it
    crashed: bool
    #: "SIGSEGV", "SIGKILL", "exit status 1", or "no exit status within 1 s"
    what: str


def ending(proc: subprocess.Popen[bytes], wait_s: float = 1.0) -> Ending:
    """Wait up to ``wait_s`` for ``proc`` to exit and say how it ended. A signal in ``KILLED``, any
    other signal, exit status 0 or no status in time is not a crash. Never raises."""
    try:
        rc = proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        return Ending(False, f"no exit status within {wait_s:g} s")
    if rc >= 0:
        return Ending(rc != 0, f"exit status {rc}")
    try:
        return Ending(-rc in CRASHED, signal.Signals(-rc).name)
    except ValueError:
        return Ending(False, f"signal {-rc}")


class Raw(NamedTuple):
    """A binary input as the request carried it: its bytes in the body, copied once into the buffer."""

    raw: memoryview
    shape: Sequence[int]
    dtype: str


@dataclass
class Worker:
    """One worker process and its end of the wire (used by one caller at a time)."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    buf: wire.Buffer
    pid: int = 0
    #: the GPU it is pinned to (``--gpus``: its CUDA_VISIBLE_DEVICES), None: the front-end's devices
    gpu: int | None = None
    release: str = ""
    ready_at: float = 0.0
    busy: bool = False
    dead: bool = False
    seq: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    #: seconds ``acall`` polls for a small call's answer before the loop waits for the socket (``_spin``;
    #: ``--loop-spin-us``), and whether the last answer came soon enough to poll for the next one
    spin_s: float = 0.0
    quick: bool = True
    #: when the last call frame went out (``time.perf_counter``)
    sent_at: float = 0.0
    #: the socket may be in non-blocking mode: uvloop's ``add_reader`` (``_readable``) sets O_NONBLOCK and leaves
    #: it, and a blocking read (``call``) would then see EAGAIN at once, as if its timeout had passed
    nonblocking: bool = False

    def __post_init__(self) -> None:
        self.reader = wire.Reader(self.sock, fds=False)

    def _timeout(self, seconds: float) -> None:
        if seconds != self.timeout_s:
            wire.set_timeout(self.sock, seconds)
            self.timeout_s = seconds

    @classmethod
    def spawn(cls, target: Target, options: dict[str, Any], gpu: int | None = None) -> Worker:
        """Start a worker loading ``target`` (its path, mode and evidence pin); ``wait_ready`` waits for it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = subprocess.Popen([sys.executable, "-m", "tileship.serve.worker", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=gpu_map.environment(gpu))
        theirs.close()
        w = cls(proc, ours, wire.Buffer.create(BUFFER_BYTES), pid=proc.pid, gpu=gpu,
                spin_s=float(options.get("loop_spin_us", 0.0)) * 1e-6)
        wire.send(ours, {"op": "start", "path": str(target.path), "reference_only": target.reference_only,
                         "evidence": target.evidence, "release_id": target.release_id, "options": options})
        wire.send(ours, {"op": "map", "size": w.buf.size}, fd=w.buf.fd)
        return w

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker has loaded and warmed its release. Raises WorkerError."""
        self._timeout(timeout_s)
        try:
            msg = self.reader.frame()
        except (wire.PeerGone, OSError) as exc:
            raise WorkerError(f"worker {self.pid} exited while loading (status {self.proc.poll()}): {exc}") from None
        if msg.get("op") != "ready":
            raise WorkerError(f"worker {self.pid} could not load the release: {msg.get('error')}")
        self.release, self.info, self.ready_at = msg["release"], msg, time.monotonic()

    def call(self, name: str, args: list[Any], out_bytes: int, timeout_s: float) -> dict[str, Any]:
        """Inputs into the buffer, one frame out, one back. Raises WorkerDied, TimeoutError."""
        if self.nonblocking:
            os.set_blocking(self.sock.fileno(), True)
            self.nonblocking = False
        for _ in range(2):  # a second round only when the outputs did not fit
            out_off = self._send(name, args, out_bytes, timeout_s)
            try:
                reply = self.reader.frame()
            except (wire.PeerGone, ConnectionResetError) as exc:
                raise self._died(exc) from None
            if (need := self._need(reply)) is None:
                return reply
            out_bytes = need - out_off
        raise WorkerError(f"worker {self.pid}: the outputs did not fit the buffer twice")

    async def acall(self, name: str, args: list[Any], out_bytes: int, timeout_s: float) -> dict[str, Any]:
        """``call`` from the event loop: the same frames, but the wait for the answer is the loop's
        (the socket's readiness), so no thread is woken on either side of it. Raises as ``call``."""
        return await self.answer(name, args, out_bytes, timeout_s, self._send(name, args, out_bytes, timeout_s))

    async def answer(self, name: str, args: list[Any], out_bytes: int, timeout_s: float,
                     out_off: int | None) -> dict[str, Any]:
        """The rest of ``acall`` once ``_send`` has sent the call (it returned ``out_off``; None: send it now).
        Raises as ``call``."""
        loop = asyncio.get_running_loop()
        for _ in range(2):
            if out_off is None:
                out_off = self._send(name, args, out_bytes, timeout_s)
            sent = self.sent_at
            deadline = loop.time() + timeout_s - (time.perf_counter() - sent)
            try:
                reply = self._spin(sent)
                while reply is None:
                    await self._readable(loop, deadline)
                    reply = self.reader.poll()
            except (wire.PeerGone, ConnectionResetError) as exc:
                raise self._died(exc) from None
            self.quick = time.perf_counter() - sent <= 2 * self.spin_s
            if (need := self._need(reply)) is None:
                return reply
            out_bytes, out_off = need - out_off, None
        raise WorkerError(f"worker {self.pid}: the outputs did not fit the buffer twice")

    def _spin(self, sent: float) -> dict[str, Any] | None:
        """The answer if it comes within ``spin_s`` of polling (the event loop does nothing else meanwhile), else
        None. Polls only while the previous answer came within twice that: a worker that takes longer does
        not hold the loop. Waking a thread that sleeps in ``epoll`` costs tens of microseconds, about as much
        as a small call's whole round trip (on the 2-core CPU machine 150-170 us for ``acall`` of a 1000-element
        add without polling on either side, 40 us with it)."""
        reply = self.reader.poll()
        if reply is not None or not self.spin_s or not self.quick:
            return reply
        end = sent + self.spin_s
        while (reply := self.reader.poll()) is None and time.perf_counter() < end:
            pass
        return reply

    async def _readable(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Until the socket has bytes (or end-of-file); TimeoutError past ``deadline`` (loop time).
        One future woken by the reader callback or by a timer: no ``wait_for``, whose extra
        futures cost the loop more iterations than the call's own work on a small request."""
        ready = loop.create_future()
        fd = self.sock.fileno()

        def wake(timed_out: bool) -> None:
            if not ready.done():
                ready.set_result(timed_out)

        loop.add_reader(fd, wake, False)
        self.nonblocking = True
        timer = loop.call_at(deadline, wake, True)
        try:
            if await ready:
                raise TimeoutError("no answer within the receive timeout")
        finally:
            timer.cancel()
            loop.remove_reader(fd)

    def _send(self, name: str, args: list[Any], out_bytes: int, timeout_s: float) -> int:
        """Inputs into the buffer (grown to fit), the call frame out; the outputs' offset."""
        off, descs = 0, []
        sizes = [len(a.raw) if type(a) is Raw else a.numel() * a.element_size() if hasattr(a, "numel") else 0
                 for a in args]
        out_off = sum(wire.align(s) for s in sizes)
        if (need := out_off + wire.align(out_bytes + wire.ALIGN * 4)) > self.buf.size:
            try:
                self._fit(need)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise self._died(exc) from None
        for a, n in zip(args, sizes, strict=True):
            if isinstance(a, Raw):
                descs.append(self.buf.put_raw(off, a.raw, a.shape, a.dtype))
                off = wire.align(off + n)
            elif hasattr(a, "numel"):
                descs.append(self.buf.put(off, a))
                off = wire.align(off + n)
            else:
                descs.append(wire.scalar(a))
        self.seq += 1
        self._timeout(timeout_s)
        try:
            wire.send(self.sock, {"op": "call", "id": self.seq, "name": name, "args": descs,
                                  "out": [out_off, self.buf.size - out_off]})
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._died(exc) from None
        self.sent_at = time.perf_counter()
        return out_off

    def _died(self, exc: BaseException) -> WorkerDied:
        return WorkerDied(f"worker {self.pid} went away during the call ({type(exc).__name__})")

    def _need(self, reply: dict[str, Any]) -> int | None:
        """None for an answer; the bytes the outputs need when they did not fit. Raises WorkerDied
        when the answer is to another call."""
        if reply.get("id") != self.seq:
            raise WorkerDied(f"worker {self.pid} answered call {reply.get('id')} to call {self.seq}")
        return int(reply["need"]) if "need" in reply else None

    def _fit(self, need: int) -> None:
        if need <= self.buf.size:
            return
        size = max(need, self.buf.size * 2)
        new = wire.Buffer.create(size)
        wire.send(self.sock, {"op": "map", "size": size}, fd=new.fd)
        self.buf.close()
        self.buf = new

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.proc.wait()
        self.buf.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            wire.send(self.sock, {"op": "stop"})
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
