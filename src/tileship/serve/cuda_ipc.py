"""CUDA IPC through the driver API (``libcuda.so.1``, ctypes): open a device allocation another
process on this host exported with ``cudaIpcGetMemHandle``, learn its true extent, close it.

    HANDLE_BYTES  the size of a ``cudaIpcMemHandle_t`` / ``CUipcMemHandle`` (64)
    Mapping       one opened allocation: ``ptr``, ``device`` (ordinal), ``size`` (bytes from ``ptr`` to its end)
    open_handle   (raw handle, device ordinal) -> Mapping; ``IpcError`` naming the driver's error
    close         give a Mapping back (the last holder of a handle unmaps it)

Contract: every call runs with the device's primary context pushed on the calling thread and
popped after (the context torch itself uses), so any thread may call, and nothing here changes
the CUDA runtime's sticky "last error" that torch checks after its own launches. Each open
mapping keeps one retain of that context, so the context (and the mapping in it) outlives every
temporary retain here even before torch has used the device. One handle
opened twice in this process (two region names over one allocation) is mapped once and
reference-counted: the driver refuses a second mapping of the same handle in a context.
``Mapping.size`` comes from ``cuMemGetAddressRange`` on the opened pointer, never from the
client: the caller bounds every access by it.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

HANDLE_BYTES = 64
#: CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: a handle from another device of this host opens too
_LAZY_PEER = 1
#: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
_ATTR_DEVICE_ORDINAL = 9


class IpcError(Exception):
    """A driver call failed; the message names the call and the driver's error."""


class _Handle(ctypes.Structure):
    # bytes, not c_char: a c_char array stops at the first NUL, and handles hold many
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


@dataclass(frozen=True)
class Mapping:
    """An opened IPC allocation: device pointer, the device it lives on, bytes from ``ptr`` to its end."""

    ptr: int
    device: int
    size: int
    handle: bytes


class _Driver:
    """``libcuda.so.1``, loaded and initialized once (``IpcError`` when there is no driver)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise IpcError(f"no CUDA driver in this process (libcuda.so.1: {exc})") from None
        self.check("cuInit", self.lib.cuInit(ctypes.c_uint(0)))

    def check(self, call: str, rc: int) -> None:
        if rc == 0:
            return
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(rc, ctypes.byref(name))
        self.lib.cuGetErrorString(rc, ctypes.byref(text))
        what = (name.value or b"CUDA error").decode(errors="replace")
        why = (text.value or b"").decode(errors="replace")
        raise IpcError(f"{call} failed: {what} ({rc}): {why}")

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def hold(self, ordinal: int, keep: bool) -> None:
        """Retain (``keep``) or release ``ordinal``'s primary context once more. A mapping holds one
        retain for its life: when nothing else in the process has retained the context yet (torch
        has not touched that device), the last release would destroy it and every mapping in it."""
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)))
        if keep:
            self.check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        else:
            self.lib.cuDevicePrimaryCtxRelease_v2(dev)

    def run_on(self, ordinal: int, fn: Any) -> Any:
        """``fn()`` with ``ordinal``'s primary context current on this thread, popped after."""
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)))
        self.check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        try:
            self.check("cuCtxPushCurrent", self.lib.cuCtxPushCurrent_v2(ctx))
            try:
                return fn()
            finally:
                self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            self.lib.cuDevicePrimaryCtxRelease_v2(dev)


_lock = threading.Lock()
_driver: _Driver | None = None
#: (handle, device asked for) -> [Mapping, holders]
_open: dict[tuple[bytes, int], list[Any]] = {}


def _get_driver() -> _Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


def device_count() -> int:
    """Devices the driver sees in this process (``IpcError`` without a driver)."""
    return _get_driver().device_count()


def open_handle(handle: bytes, device: int) -> Mapping:
    """Map the allocation ``handle`` (``HANDLE_BYTES`` raw bytes) names, through ``device``'s context.

    Raises IpcError when the driver refuses: a handle of a process that has exited, of another
    host or boot, or bytes that are no handle at all."""
    if len(handle) != HANDLE_BYTES:
        raise IpcError(f"a CUDA IPC handle is {HANDLE_BYTES} bytes, got {len(handle)}")
    drv = _get_driver()
    with _lock:
        held = _open.get((handle, device))
        if held is not None:
            held[1] += 1
            return held[0]

        def opened() -> Mapping:
            ptr = ctypes.c_uint64()
            drv.check("cuIpcOpenMemHandle", drv.lib.cuIpcOpenMemHandle_v2(
                ctypes.byref(ptr), _Handle.from_buffer_copy(handle), ctypes.c_uint(_LAZY_PEER)))
            try:
                base, size, ordinal = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_int()
                drv.check("cuMemGetAddressRange", drv.lib.cuMemGetAddressRange_v2(
                    ctypes.byref(base), ctypes.byref(size), ptr))
                drv.check("cuPointerGetAttribute", drv.lib.cuPointerGetAttribute(
                    ctypes.byref(ordinal), ctypes.c_int(_ATTR_DEVICE_ORDINAL), ptr))
            except IpcError:
                drv.lib.cuIpcCloseMemHandle(ptr)
                raise
            return Mapping(ptr.value, ordinal.value, base.value + size.value - ptr.value, handle)

        drv.hold(device, True)
        try:
            mapping = drv.run_on(device, opened)
        except IpcError:
            drv.hold(device, False)
            raise
        _open[(handle, device)] = [mapping, 1]
        return mapping


def close(mapping: Mapping, device: int) -> str | None:
    """Drop one holder of ``mapping`` (opened through ``device``); the last one unmaps it.
    The caller has finished every device access to it (synchronized) before calling.

    Returns None, or the driver's refusal to unmap as a message: the mapping is forgotten either
    way. (The driver refuses when the exporting process freed the allocation first.)"""
    drv = _get_driver()
    with _lock:
        held = _open.get((mapping.handle, device))
        if held is None:
            return None
        held[1] -= 1
        if held[1] > 0:
            return None
        del _open[(mapping.handle, device)]
        try:
            drv.run_on(device, lambda: drv.check("cuIpcCloseMemHandle",
                                                 drv.lib.cuIpcCloseMemHandle(ctypes.c_uint64(mapping.ptr))))
        except IpcError as exc:
            return str(exc)
        finally:
            drv.hold(device, False)
        return None
