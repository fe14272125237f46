"""Triton's CUDA shared memory extension: device allocations a process on this host exported with
CUDA IPC (``tritonclient.utils.cuda_shared_memory``), registered by name, read and written on the
GPU with no host copy.

    CudaRegion    one registered window ``[0, byte_size)`` of an opened IPC allocation
    raw_handle    the REST register body's ``raw_handle`` ({"b64": ...}) -> the handle's bytes (400 if not)

Contract, as ``serve.shm`` for system regions: nothing a client sends makes the server touch
device memory outside a registered window. Registration opens the handle (``serve.cuda_ipc``)
and refuses a ``byte_size`` past the end of the allocation as the driver reports it, so a
client cannot widen its window by claiming a larger size. An input is read in place: the call
gets a view of the window (``lend``), no copy, as Triton does (one the operator updates in place is
copied first: the server never writes an input region, ``call_plan.CallPlan.arguments``), and the client must leave
those bytes alone until the response arrives; the request gives the view back (``give_back``) once its
call has finished on the device. Outputs are copied into their window (one device-to-device copy)
and synchronized before the response is sent, so the client reads finished bytes. Unregistering
waits until no request holds a view and the device's queued work is done before the mapping
goes, so nothing queued ever touches unmapped memory (after ``LEND_WAIT_S`` it gives up and
leaves the mapping in place rather than risk a fault). Every refusal is ``BadRequest`` 400 naming
the region and field; an unknown region is 404 (``serve.shm.Regions``).
"""

from __future__ import annotations

import base64
import binascii
import threading
from typing import TYPE_CHECKING, Any

from tileship.serve import cuda_ipc
from tileship.serve.shm import Window
from tileship.serve.validate import BadRequest, short

if TYPE_CHECKING:
    from tileship.serve.shm import Ref

KIND = "cuda"
#: how long unregistering waits for the requests reading a region in place
LEND_WAIT_S = 60.0


def raw_handle(value: Any, name: str) -> bytes:
    """The handle bytes in a REST register body's ``raw_handle`` (``{"b64": "<base64>"}``)."""
    b64 = value.get("b64") if isinstance(value, dict) else None
    if not isinstance(b64, str):
        raise BadRequest(400, f'region {short(name)}: raw_handle must be {{"b64": "<base64 of the '
                              f'{cuda_ipc.HANDLE_BYTES}-byte cudaIpcMemHandle_t>"}}, got {short(value)}')
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(400, f"region {short(name)}: raw_handle.b64 is not base64") from None


class CudaRegion(Window):
    """One registered CUDA IPC allocation. ``BadRequest`` 400 when it cannot be opened or is too small."""

    kind = KIND
    label = "CUDA shared-memory region"

    def __init__(self, name: str, handle: Any, device_id: Any, byte_size: Any) -> None:
        if not isinstance(handle, (bytes, bytearray)) or len(handle) != cuda_ipc.HANDLE_BYTES:
            got = f"{len(handle)} bytes" if isinstance(handle, (bytes, bytearray)) else short(handle)
            raise BadRequest(400, f"region {short(name)}: raw_handle must be the {cuda_ipc.HANDLE_BYTES} bytes of a "
                                  f"cudaIpcMemHandle_t, got {got}")
        for field, v in (("device_id", device_id), ("byte_size", byte_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise BadRequest(400, f"region {short(name)}: {field} must be a non-negative integer, got {short(v)}")
        if byte_size < 1:
            raise BadRequest(400, f"region {short(name)}: byte_size must be at least 1, got {byte_size}")
        torch = _torch_on_gpu(name)
        try:
            count = cuda_ipc.device_count()
            if device_id >= count:
                raise BadRequest(400, f"region {short(name)}: device_id {device_id} does not exist: this server "
                                      f"sees {count} CUDA device(s)")
            torch.cuda.init()  # torch's primary context first: the mapping is made in the context torch uses
            mapping = cuda_ipc.open_handle(bytes(handle), device_id)
        except cuda_ipc.IpcError as exc:
            raise BadRequest(400, f"region {short(name)}: the CUDA IPC handle cannot be opened on device "
                                  f"{device_id} ({exc}); is the exporting process still running on this host?"
                             ) from None
        if byte_size > mapping.size:
            cuda_ipc.close(mapping, device_id)
            raise BadRequest(400, f"region {short(name)}: byte_size {byte_size} runs past the end of the CUDA "
                                  f"allocation the handle names ({mapping.size} bytes)")
        self.name, self.device_id, self.byte_size = name, device_id, byte_size
        self.closed = False
        self.close_error: str | None = None
        self._mapping = mapping
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last lent view comes back
        self._lent = 0
        self._view = torch.as_tensor(_ArrayInterface(mapping.ptr, byte_size), device=f"cuda:{mapping.device}")

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, ref: Ref, where: str) -> Any:
        """A copy of ``ref``'s bytes: a fresh uint8 tensor on the region's device (queued, not synchronized)."""
        with self._lock:
            start = self._start(ref, where)
            return self._view[start:start + ref.byte_size].clone()

    def lend(self, ref: Ref, where: str) -> Any:
        """``ref``'s bytes in place (a uint8 view on the region's device, no copy), counted until
        ``give_back``: the region stays mapped while it is out. BadRequest 404/400 as ``check``."""
        with self._lock:
            start = self._start(ref, where)
            self._lent += 1
            return self._view[start:start + ref.byte_size]

    def give_back(self) -> None:
        """One view from ``lend`` is no longer used (its call has finished on the device)."""
        with self._lock:
            self._lent -= 1
            if self._lent == 0:
                self._idle.notify_all()

    def write(self, ref: Ref, data: Any, where: str) -> None:
        """Copy the tensor ``data`` (``ref.byte_size`` bytes, any device) into ``ref``, synchronized."""
        with self._lock:
            start = self._start(ref, where)
            dst = self._view[start:start + ref.byte_size]
            dst.copy_(data.detach().contiguous().reshape(-1).view(dst.dtype))
            _torch().cuda.current_stream(dst.device).synchronize()

    def close(self) -> None:
        """Unmap, once no request holds a view and the device's queued work has finished. A mapping
        the driver refuses to unmap (the client freed its allocation first) is forgotten all the
        same; one still lent after ``LEND_WAIT_S`` stays mapped. Either way: ``close_error``."""
        with self._lock:
            if self.closed:
                return
            self.closed = True  # no new view from here on
            if not self._idle.wait_for(lambda: self._lent == 0, timeout=LEND_WAIT_S):
                self.close_error = f"{self._lent} request(s) still read it after {LEND_WAIT_S:g} s: left mapped"
                return
            device = self._view.device
            self._view = None
            _torch().cuda.synchronize(device)
            self.close_error = cuda_ipc.close(self._mapping, self.device_id)


class _ArrayInterface:
    """``__cuda_array_interface__`` over ``n`` bytes at ``ptr``: ``torch.as_tensor`` views it, no copy."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


def _torch() -> Any:
    import torch

    return torch


def _torch_on_gpu(name: str) -> Any:
    torch = _torch()
    if not torch.cuda.is_available():
        raise BadRequest(400, f"region {short(name)}: CUDA shared memory needs a GPU, and torch.cuda is not "
                              "available in this server")
    return torch
