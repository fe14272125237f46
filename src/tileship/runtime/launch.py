"""Launchers: call a loaded TileLang kernel's compiled entry point without its per-call Python adapter.

TileLang's adapters redo per call what is fixed once the dispatcher has a memo key (device,
dtypes, shapes): count the arguments, walk the parameters to place inputs and outputs,
resolve every symbolic dim from the tensors, pick the device and the stream, and (the
``cython`` backend) build ``ctypes`` objects. ``resolve`` does that work once per key and
returns a launcher ``launch(args, out) -> output`` that only allocates the outputs (torch's
caching allocator, or the caller's ``out`` tensors) and calls the compiled function (a kernel
with no outputs, one that only updates inputs in place, returns None):

    tvm_ffi  the module's entry function, torch tensors passed straight through (TVM-FFI reads
             torch's current stream of the tensors' device through the DLPack exchange API).
             With the callee-allocated output ABI (TileLang's CUDA default) the function
             allocates its outputs through torch's allocator itself; a caller's ``out`` is then
             filled with ``copy_`` (``writes_out`` False).
    cython   the library's ``call`` symbol through one ``ctypes`` prototype: data pointers,
             the symbolic dims of this key as int64, a NULL stream (the CPU "c" target).

Outputs are allocated with ``torch.empty(size=shape, ...)``: a shape passed positionally takes
torch's argument parser a slower way (``benchmarks/dispatch_breakdown.py`` times both).

``resolve`` never raises: a kernel it cannot serve this way returns ``Launcher(None, why)``
and the dispatcher calls the adapter as before, recording why.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tileship import env

#: ``launch(args, out)``: ``args`` the call's arguments as given, ``out`` None or the caller's
#: output tensors (validated); returns the output (one tensor, or a tuple for several)
LaunchFn = Callable[[tuple[Any, ...], Sequence[Any] | None], Any]


@dataclass(frozen=True)
class Launcher:
    """A resolved fast launcher, or why there is none (``fn`` None, ``why`` says why)."""

    fn: LaunchFn | None
    why: str = ""
    #: "tvm_ffi" | "tvm_ffi_callee_alloc" | "ctypes" | "adapter"
    kind: str = "adapter"
    #: True when ``fn`` writes into a caller's ``out`` directly (False: it copies into it)
    writes_out: bool = True
    #: the tvm-ffi entry function when ``fn`` only passes the call's tensors to it (and, with ``anchor``,
    #: the first one again as the allocator anchor), with one kernel-allocated output or none: what the
    #: compiled dispatch table (``runtime.native``) may call directly
    ffi: Any = None
    anchor: bool = False
    #: a "c"-target kernel the compiled table may call directly: (call address, get_last_error address,
    #: each parameter's input index or -1 for the output, the symbolic dims, the output's (shape, torch
    #: dtype) or None); set with one output or none, all arguments tensors
    c_call: tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], Any] | None] | None = None


def resolve(kernel: Any, outs: Sequence[tuple[tuple[int, ...], Any]] | None, args: tuple[Any, ...],
            device: Any) -> Launcher:
    """The fast launcher of ``kernel`` (``runtime.artifact``'s, or TileLang's JITKernel) for calls shaped like ``args``.

    ``outs`` is each output's (shape, torch dtype) from the declaration, None when unknown;
    ``device`` the inputs' device. Never raises; a refusal says why."""
    adapter = getattr(kernel, "adapter", None)
    if adapter is None or not hasattr(adapter, "result_idx") or not hasattr(adapter, "params"):
        return Launcher(None, f"not a TileLang kernel ({type(kernel).__name__})")
    if outs is None:
        return Launcher(None, "the declaration gives no output shapes for these arguments")
    kind = _BACKENDS.get(getattr(adapter, "backend", None) or type(adapter).__name__, type(adapter).__name__)
    try:
        problem = _check_outputs(adapter, outs, args)
        if problem:
            return Launcher(None, problem)
        if kind == "TVMFFIKernelAdapter":
            if getattr(device, "type", None) == "cuda" and not env.fast_launch_cuda():
                return Launcher(None, "TILESHIP_FAST_LAUNCH keeps CUDA kernels on TileLang's adapter")
            return _tvm_ffi(adapter, outs, device)
        if kind == "CythonKernelAdapter" and getattr(device, "type", None) == "cpu":
            return _ctypes(adapter, outs, args)
    except Exception as exc:  # anything TileLang's internals do differently from 0.1.15
        return Launcher(None, f"cannot resolve the entry point: {type(exc).__name__}: {exc}")
    return Launcher(None, f"execution backend {kind} on {device} is served by TileLang's adapter")


#: tileship's own kernels (``runtime.artifact``) name their backend; TileLang's adapters by their class
_BACKENDS = {"tvm_ffi": "TVMFFIKernelAdapter", "cython": "CythonKernelAdapter"}


def _check_outputs(adapter: Any, outs: Sequence[tuple[tuple[int, ...], Any]], args: tuple[Any, ...]) -> str:
    """'' when the declaration's outputs agree with the kernel's parameters, else what differs."""
    idx = list(adapter.result_idx)
    if len(idx) != len(outs):
        return f"the kernel has {len(idx)} outputs, the declaration {len(outs)}"
    if len(adapter.params) != len(args) + len(idx):
        return f"the kernel takes {len(adapter.params) - len(idx)} inputs, the call gives {len(args)}"
    for j, (i, (shape, dtype)) in enumerate(zip(idx, outs, strict=True)):
        p, what = adapter.params[i], f"output {j} (parameter {i})"
        if p.torch_dtype() != dtype:
            return f"{what}: the kernel's dtype is {p.torch_dtype()}, the declaration's {dtype}"
        if len(p.shape) != len(shape):
            return f"{what}: the kernel's rank is {len(p.shape)}, the declaration's {len(shape)}"
        for d, s in zip(p.shape, shape, strict=True):
            if (isinstance(d, int) or type(d).__name__ == "IntImm") and int(d) != s:  # a tir.Var: dynamic
                return f"{what}: the kernel's shape {list(p.shape)} differs from the declaration's {shape}"
    return ""


def _places(adapter: Any, n_args: int) -> list[tuple[bool, int]]:
    """Each kernel parameter as (is_output, index into args or outs), in parameter order."""
    idx = list(adapter.result_idx)
    places, ins = [], 0
    for i in range(n_args + len(idx)):
        if i in idx:
            places.append((True, idx.index(i)))
        else:
            places.append((False, ins))
            ins += 1
    return places


def _tvm_ffi(adapter: Any, outs: Sequence[tuple[tuple[int, ...], Any]], device: Any) -> Launcher:
    import torch

    exe = adapter._get_executable()
    fn = exe.get_function(getattr(exe, "entry_name", None) or "main")
    if fn is None:
        return Launcher(None, "the tvm-ffi module has no entry function")
    single = len(outs) == 1
    if getattr(adapter, "_ffi_callee_allocated_output_abi", False):
        def callee(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
            res = fn(*args, args[0])  # the anchor tensor installs torch's allocator for the outputs
            if out is None:
                return res if single else tuple(res)
            for o, r in zip(out, (res,) if single else res, strict=True):
                o.copy_(r)
            return out[0] if single else tuple(out)

        return Launcher(callee, kind="tvm_ffi_callee_alloc", writes_out=False, ffi=fn if single else None,
                        anchor=True)
    empty = torch.empty
    shapes = [(s, d) for s, d in outs]
    n_args = len(adapter.params) - len(outs)
    places = _places(adapter, n_args)
    if all(not is_out for is_out, _ in places[:n_args]) and single:  # inputs first, one output: the common form
        (s0, d0), = shapes

        def tail1(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
            o = empty(size=s0, dtype=d0, device=device) if out is None else out[0]
            fn(*args, o)
            return o

        return Launcher(tail1, kind="tvm_ffi")
    if all(not is_out for is_out, _ in places[:n_args]):  # inputs first, outputs at the tail
        def tail(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
            o = out if out is not None else [empty(size=s, dtype=d, device=device) for s, d in shapes]
            fn(*args, *o)
            return o[0] if single else (tuple(o) or None)

        return Launcher(tail, kind="tvm_ffi", ffi=None if shapes else fn)  # no outputs: updates inputs only

    def placed(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
        o = out if out is not None else [empty(size=s, dtype=d, device=device) for s, d in shapes]
        fn(*[(o[j] if is_out else args[j]) for is_out, j in places])
        return o[0] if single else (tuple(o) or None)

    return Launcher(placed, kind="tvm_ffi")


def _ctypes(adapter: Any, outs: Sequence[tuple[tuple[int, ...], Any]], args: tuple[Any, ...]) -> Launcher:
    import torch

    if any(not isinstance(a, torch.Tensor) for a in args):
        return Launcher(None, "scalar arguments go through the cython adapter")
    n_args = len(args)
    places = _places(adapter, n_args)
    shapes = [tuple(outs[j][0]) if is_out else tuple(args[j].shape) for is_out, j in places]
    dyn = []
    for _var, (ref, buf, dim, scale) in adapter.dynamic_symbolic_map.items():
        shape = shapes[buf]
        dyn.append(shape[dim] if ref == 0 else math.prod(shape[dim + 1:]) * scale)  # contiguous strides
    addr = ctypes.cast(adapter.lib.call, ctypes.c_void_p).value
    if addr is None:
        return Launcher(None, "the library's call entry point is a null pointer")
    proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * len(places)),
                             *([ctypes.c_int64] * len(dyn)), ctypes.c_void_p)
    fn = proto(addr)
    lib = adapter.lib  # keeps the library loaded as long as the launcher lives
    tail_args = (*dyn, None)
    empty = torch.empty
    dev = args[0].device
    single = len(outs) == 1
    outs = [(s, d) for s, d in outs]
    in_order = all(not is_out for is_out, _ in places[:n_args])

    err = ctypes.cast(lib.get_last_error, ctypes.c_void_p).value or 0
    c_call = None
    if len(outs) <= 1:
        sources = tuple(-1 if is_out else j for is_out, j in places)
        c_call = (addr, err, sources, tuple(int(v) for v in dyn), (tuple(outs[0][0]), outs[0][1]) if outs else None)

    def failed(rc: int) -> RuntimeError:
        return RuntimeError(f"kernel call failed ({rc}): {lib.get_last_error().decode(errors='replace')}")

    if in_order and single and n_args in (1, 2):  # the common forms, without per-call list building
        (s0, d0), = outs
        if n_args == 2:
            def launch2(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
                a, b = args
                o = empty(size=s0, dtype=d0, device=dev) if out is None else out[0]
                rc = fn(a.data_ptr(), b.data_ptr(), o.data_ptr(), *tail_args)
                if rc:
                    raise failed(rc)
                return o

            return Launcher(launch2, kind="ctypes", c_call=c_call)

        def launch1(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
            o = empty(size=s0, dtype=d0, device=dev) if out is None else out[0]
            rc = fn(args[0].data_ptr(), o.data_ptr(), *tail_args)
            if rc:
                raise failed(rc)
            return o

        return Launcher(launch1, kind="ctypes", c_call=c_call)

    def launch(args: tuple[Any, ...], out: Sequence[Any] | None) -> Any:
        o = out if out is not None else [empty(size=s, dtype=d, device=dev) for s, d in outs]
        if in_order:
            rc = fn(*[a.data_ptr() for a in args], *[t.data_ptr() for t in o], *tail_args)
        else:
            rc = fn(*[(o[j] if is_out else args[j]).data_ptr() for is_out, j in places], *tail_args)
        if rc != 0:
            raise failed(rc)
        return o[0] if single else (tuple(o) or None)

    return Launcher(launch, kind="ctypes", c_call=c_call)


__all__ = ["Launcher", "LaunchFn", "resolve"]
