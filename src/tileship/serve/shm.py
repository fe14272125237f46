"""Triton's shared memory extensions: registered windows of ``/dev/shm`` files (system) and of
CUDA IPC allocations (``serve.cuda_shm``) that inference requests read inputs from and write
outputs into, instead of carrying the bytes.

    Regions    the registry of one server, both kinds under one namespace of names: register,
               register_cuda, unregister, status, close (thread-safe)
    Region     one registered window of ``/dev/shm/<key>``: bounds-checked reads and writes
    Ref        where one tensor lies: (region, offset, byte_size), from a tensor's parameters
    ref_of     the Ref in a tensor's parameters, or None

A request's shared-memory inputs and outputs are wired in ``serve.shm_requests`` (``attach``).

Contract: nothing a client sends makes the server read or write outside a registered window,
or fault. Registration opens the file and refuses a window past its end; every read and write is
checked against the window and done with ``pread``/``pwrite`` on the file, never through a
mapping: a file the client truncates or shrinks at any instant gives a short read (a 400 naming
the region), never a SIGBUS in the server. Inputs are copied out of the region once, when the
request is parsed, so the call never touches client memory that may change under it.
Every refusal is ``BadRequest``: 400 for a malformed or out-of-bounds value, 404 for an unknown
region, 409 for a name registered twice; the message names the field and the region.

Unregistering (or stopping) takes the name at once and closes the region once no request holds it:
a request admitted with a shared-memory output holds its region (``Region.hold``) until its call
has ended, and writes its output there even when the name was unregistered (or registered again)
meanwhile, as Triton defers an unregister until the requests using the region are done. A read or
write in progress finishes first (each holds the region's lock).
"""

from __future__ import annotations

import os
import re
import resource
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tileship.serve.validate import BadRequest, clip, short

#: where POSIX shm_open names live on Linux
SHM_DIR = "/dev/shm"
#: regions one server holds at once (a system region holds a file descriptor): at most this, and at most a
#: quarter of the process's descriptors (``region_limit``)
MAX_REGIONS = 1024
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
_KEY = re.compile(r"/?([^/\x00]{1,255})")


class RegionExists(BadRequest):
    """A region name registered twice (409; gRPC ALREADY_EXISTS)."""


class RegionLimit(BadRequest):
    """One region more than ``region_limit`` (400; gRPC RESOURCE_EXHAUSTED)."""


def region_limit() -> int:
    """How many regions this process may hold: ``MAX_REGIONS``, and at most a quarter of its soft limit on
    open files, so that registering never takes the descriptors connections and files need (at the usual
    ``ulimit -n`` of 1024, 1024 regions left the server unable to accept a connection while it said ready)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_REGIONS if soft == resource.RLIM_INFINITY else max(1, min(MAX_REGIONS, soft // 4))


@dataclass(frozen=True)
class Ref:
    """A tensor's bytes in a region: ``byte_size`` bytes at ``offset`` from the window's start."""

    region: str
    offset: int
    byte_size: int


def _nonneg(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadRequest(400, f"{where} must be a non-negative integer, got {short(v)}")
    return v


def ref_of(params: Mapping[str, Any], where: str) -> Ref | None:
    """The shared-memory Ref in a tensor's ``params`` (None without ``shared_memory_region``).
    ``where`` names the tensor in messages ("input A"). Raises BadRequest 400 for a malformed one."""
    if REGION not in params:
        extra = [k for k in (OFFSET, BYTE_SIZE) if k in params]
        if extra:
            raise BadRequest(400, f"{where}: {extra[0]} is given without {REGION}")
        return None
    region = params[REGION]
    if not isinstance(region, str) or not region:
        raise BadRequest(400, f"{where}: {REGION} must be a non-empty string, got {short(region)}")
    if BYTE_SIZE not in params:
        raise BadRequest(400, f"{where}: {REGION} {short(region)} needs {BYTE_SIZE}")
    return Ref(region, _nonneg(params.get(OFFSET, 0), f"{where}: {OFFSET}"),
               _nonneg(params[BYTE_SIZE], f"{where}: {BYTE_SIZE}"))


def _path(key: Any) -> str:
    m = _KEY.fullmatch(key) if isinstance(key, str) else None
    if m is None or m.group(1) in (".", ".."):
        raise BadRequest(400, f"shared-memory key {short(key)} is not a POSIX shared-memory name (\"/name\", one "
                              "component of at most 255 characters)")
    return os.path.join(SHM_DIR, m.group(1))


class Window:
    """What a registered region of either kind shares: ``name``, ``byte_size``, ``closed``, a lock,
    and the bounds check of a request's window (``check``; ``_start`` gives its first byte in the
    underlying object, ``base`` bytes in)."""

    kind = "system"
    #: how messages name a region of this kind
    label = "shared-memory region"
    name: str
    byte_size: int
    closed: bool
    base: int = 0
    _lock: threading.Lock

    def check(self, ref: Ref, where: str) -> None:
        """Raise what a read or write of ``ref`` would (404 unregistered, 400 past the end), touching nothing."""
        with self._lock:
            self._start(ref, where)

    def _start(self, ref: Ref, where: str) -> int:
        if self.closed:
            raise BadRequest(404, f"{where}: unknown shared-memory region {short(ref.region)} (unregistered)")
        if ref.offset + ref.byte_size > self.byte_size:
            raise BadRequest(400, f"{where}: {OFFSET} {ref.offset} + {BYTE_SIZE} {ref.byte_size} runs past the "
                                  f"end of {self.label} {short(ref.region)} ({self.byte_size} bytes)")
        return self.base + ref.offset


class Region(Window):
    """One registered window ``[offset, offset + byte_size)`` of ``/dev/shm/<key>``.

    Raises BadRequest 400 when the key names no regular file there or the window runs past its end."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        path = _path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BadRequest(400, f"shared-memory key {short(key)} does not exist: no file {path} (create it with "
                                  "shm_open, e.g. tritonclient.utils.shared_memory.create_shared_memory_region)"
                             ) from None
        except OSError as exc:
            raise BadRequest(400, f"shared-memory key {short(key)} cannot be opened read-write: {exc.strerror}"
                             ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BadRequest(400, f"shared-memory key {short(key)} is not a shared-memory object")
            if byte_size < 1:
                raise BadRequest(400, f"region {short(name)}: byte_size must be at least 1, got {byte_size}")
            if offset + byte_size > st.st_size:
                raise BadRequest(400, f"region {short(name)}: offset {offset} + byte_size {byte_size} runs past the "
                                      f"end of {short(key)}, which holds {st.st_size} bytes")
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.name, self.key, self.offset, self.byte_size = fd, name, key, offset, byte_size
        self.base = offset
        self.closed = False
        self._lock = threading.Lock()
        self._held = 0  # requests that will write an output here (``hold``)
        self._closing = False  # unregistered while held: closed by the last ``give_back``

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, ref: Ref, where: str, into: Any = None) -> Any:
        """A copy of ``ref``'s bytes: into ``into`` (a writable memoryview of ``ref.byte_size`` bytes, e.g. a
        pooled block's: ``serve.staging``) and that returned, else a fresh bytearray. BadRequest 404 once
        unregistered, 400 out of bounds or shrunk."""
        with self._lock:
            start = self._start(ref, where)
            buf = bytearray(ref.byte_size) if into is None else into
            mv, done = memoryview(buf).cast("B"), 0
            while done < ref.byte_size:  # a read may stop short (Linux: at most 2 GiB - 4 KiB each)
                got = os.preadv(self.fd, [mv[done:]], start + done)
                if not got:  # the end of the file, before the window's: it is shorter than at registration
                    raise self._shrunk(ref, where)
                done += got
            return buf

    def write(self, ref: Ref, data: Any, where: str) -> None:
        """Write ``data`` (a bytes-like object of ``ref.byte_size`` bytes) at ``ref``; same errors as ``read``.
        Never extends the file: a file shorter than the window is refused."""
        with self._lock:
            start = self._start(ref, where)
            if os.fstat(self.fd).st_size < start + ref.byte_size:
                raise self._shrunk(ref, where)
            mv = memoryview(data).cast("B")
            done = 0
            while done < len(mv):
                done += os.pwrite(self.fd, mv[done:], start + done)

    def _shrunk(self, ref: Ref, where: str) -> BadRequest:
        size = os.fstat(self.fd).st_size
        return BadRequest(400, f"{where}: shared-memory region {short(ref.region)} shrank to {size} bytes "
                               f"since it was registered; register it again")

    def hold(self, ref: Ref, where: str) -> None:
        """Keep the file open for a request that will write ``ref`` here, until its ``give_back``;
        BadRequest as ``check``."""
        with self._lock:
            self._start(ref, where)
            self._held += 1

    def give_back(self) -> None:
        """One ``hold`` has ended; the last one closes a region unregistered meanwhile."""
        with self._lock:
            self._held -= 1
            if not self._held and self._closing:
                self._shut()

    def close(self) -> None:
        """Close now, or once the requests holding the region have given it back."""
        with self._lock:
            if self._held:
                self._closing = True
            elif not self.closed:
                self._shut()

    def _shut(self) -> None:
        self.closed, self._closing = True, False
        os.close(self.fd)


class Regions:
    """The registered regions of one server, by name, system and CUDA alike (one namespace, as
    Triton's). Thread-safe; ``close`` unregisters all. ``cuda_off``: why this server registers no
    CUDA region (None: it does, when it has a GPU)."""

    def __init__(self, cuda_off: str | None = None) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, Any] = {}  # name -> Region | cuda_shm.CudaRegion
        self.cuda_off = cuda_off

    def register(self, name: Any, key: Any, offset: Any, byte_size: Any) -> None:
        """Map a window of ``/dev/shm/<key>`` under ``name``. BadRequest 400 for a bad value or
        window, 409 (``RegionExists``) when ``name`` is registered already."""
        check_name(name)
        offset = _nonneg(offset, f"region {short(name)}: offset")
        byte_size = _nonneg(byte_size, f"region {short(name)}: byte_size")
        self._add(name, lambda: Region(name, key, offset, byte_size))

    def register_cuda(self, name: Any, handle: Any, device_id: Any, byte_size: Any) -> None:
        """Open the CUDA IPC ``handle`` (raw bytes) under ``name`` (``cuda_shm.CudaRegion``); errors as ``register``."""
        from tileship.serve.cuda_shm import CudaRegion

        check_name(name)
        if self.cuda_off is not None:
            raise BadRequest(400, f"region {short(name)}: CUDA shared memory is off in this server: {self.cuda_off}")
        self._add(name, lambda: CudaRegion(name, handle, device_id, byte_size))

    def _add(self, name: str, make: Any) -> None:
        with self._lock:
            if name in self._regions:
                raise RegionExists(409, f"shared-memory region {short(name)} is already registered "
                                        f"({self._regions[name].kind}); unregister it first")
            if len(self._regions) >= (limit := region_limit()):
                raise RegionLimit(400, f"{limit} shared-memory regions are registered, the limit (at most a quarter of "
                                       "this server's open-file limit, ulimit -n); unregister some")
            self._regions[name] = make()

    def unregister(self, name: str | None, kind: str = "system") -> None:
        """Close ``name`` (every region of ``kind`` when None). BadRequest 404 for a name not
        registered, 400 for a region of the other kind."""
        with self._lock:
            if name is None:
                gone = [r for r in self._regions.values() if r.kind == kind]
                for r in gone:
                    del self._regions[r.name]
            else:
                gone = [self._get(name, "", kind)]
                del self._regions[name]
        for r in gone:
            r.close()

    def status(self, name: str | None, kind: str = "system") -> list[dict[str, Any]]:
        """The status rows of ``name`` (of every region of ``kind`` when None); 404 unknown, 400 other kind."""
        with self._lock:
            if name is None:
                return [r.status() for _, r in sorted(self._regions.items()) if r.kind == kind]
            return [self._get(name, "", kind).status()]

    def read(self, ref: Ref, where: str) -> Any:
        """``Region.read`` of the region ``ref`` names; BadRequest 404 for an unknown one."""
        return self.region(ref, where).read(ref, where)

    def write(self, ref: Ref, data: Any, where: str) -> None:
        """``Region.write`` of the region ``ref`` names; BadRequest 404 for an unknown one."""
        self.region(ref, where).write(ref, data, where)

    def region(self, ref: Ref, where: str) -> Any:
        """The region ``ref`` names, of either kind; BadRequest 404 for an unknown one."""
        with self._lock:
            return self._get(ref.region, f"{where}: ")

    def close(self) -> None:
        for kind in ("system", "cuda"):
            self.unregister(None, kind)

    def _get(self, name: str, where: str, kind: str | None = None) -> Any:
        r = self._regions.get(name)
        if r is None:
            raise BadRequest(404, f"{where}unknown shared-memory region {short(name)}: {self._known()}")
        if kind is not None and r.kind != kind:
            raise BadRequest(400, f"{where}shared-memory region {short(name)} is a {r.kind} region, not a {kind} "
                                  f"one: use /v2/{_ROUTE[r.kind]}")
        return r

    def _known(self) -> str:
        """The registered names for an error message: the first ``KNOWN_SHOWN`` (each cut short), then a count."""
        if not self._regions:
            return "none is registered"
        names = sorted(self._regions)
        more = f" and {len(names) - KNOWN_SHOWN} more" if len(names) > KNOWN_SHOWN else ""
        return f"registered: {', '.join(clip(n, 40) for n in names[:KNOWN_SHOWN])}{more}"


#: how many registered region names an unknown-region error lists
KNOWN_SHOWN = 8
_ROUTE = {"system": "systemsharedmemory", "cuda": "cudasharedmemory"}


#: the longest region name
MAX_NAME = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_name(name: Any) -> None:
    """BadRequest 400 unless ``name`` is a region name: 1 to ``MAX_NAME`` characters, none a control character
    (NUL, newline, ...). ``/`` and other URL-special characters are allowed (REST routes take them percent-encoded
    or, for ``/``, as is: ``serve.shm_http``). Registration over REST and gRPC, system and CUDA, checks this."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or _CONTROL.search(name):
        raise BadRequest(400, f"a region name must be a string of 1 to {MAX_NAME} characters and no control "
                              f"characters (NUL, newline, ...), got {short(name)}")
