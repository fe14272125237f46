"""Load one compiled specialization straight into the runtime: never through TileLang's Python.

``load(spec_dir, spec_id)`` reads ``artifact.json`` and ``signature.json`` (``runtime.signature``)
and opens the library with the runtime its execution backend was built for:

    cython   (the CPU "c" target) ``ctypes.CDLL`` of the library; its ``init`` runs once and
             every call goes to its exported ``call(buffers and scalars..., symbolic dims...,
             stream)``, the C ABI TileLang's host wrapper generates.
    tvm_ffi  (CUDA) ``tvm_ffi.load_module``: the tvm-ffi runtime module; the native libraries
             of the installed TileLang wheel that register what such a library calls by name
             (``libtvm_runtime.so``: the CUDA module loader; ``libtilelang.so``: the TMA
             descriptor helpers) are ``dlopen``-ed first, without importing any Python of
             TileLang or TVM (``_load_tvm_runtime`` says what that maps).

Importing ``tilelang`` executes its ``__init__``, which imports the JIT, the lowering engine,
the autotuner and ``contrib.nvcc`` (324 modules in 0.1.15): this module never does, so a
serving process that loads a release holds no compile entry point at all
(``tests/test_nojit_imports.py``). The no-JIT guard (``runtime.nojit``) stays as the second
fence for whatever else imports TileLang.

The kernel objects expose what the fast launcher (``runtime.launch``) reads: ``adapter``
(themselves), ``params``, ``result_idx``, ``dynamic_symbolic_map``, ``lib`` (cython) or
``_get_executable()`` and ``_ffi_callee_allocated_output_abi`` (tvm_ffi). Calling one directly
(``kernel(*inputs)``) allocates the outputs and returns them, as TileLang's kernel does (None for a
kernel without outputs: one that only updates inputs in place, passed as ordinary buffers).

Raises ``ArtifactLoadError`` naming the specialization; never compiles.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import json
import math
import re
import struct
import threading
from pathlib import Path
from typing import Any

from tileship import tilelang_version
from tileship.errors import ArtifactLoadError, translate
from tileship.runtime import signature as sig
from tileship.runtime.signature import Signature, Sym

# TileLang's runtime library and its artifacts' ABI are what this module relies on: a TileLang outside
# the supported range fails here, naming both versions (a release whose lock names another TileLang
# never gets here: that is blocking drift, and its references serve)
tilelang_version.check()

BACKENDS = ("cython", "tvm_ffi")
_SCALAR_CTYPES = {"float16": ctypes.c_float, "bfloat16": ctypes.c_float, "float32": ctypes.c_float,
                  "float64": ctypes.c_double, "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32,
                  "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "uint32": ctypes.c_uint32,
                  "uint64": ctypes.c_uint64, "bool": ctypes.c_bool}
_runtime_lock = threading.Lock()


def _half_bits(value: float) -> ctypes.c_uint16:
    """A float16 by-value argument of a "c"-target library: its IEEE half bits. The library takes TileLang's
    ``half`` (``half_float::half``, a class holding a uint16, passed in an integer register); a ``c_float`` went
    in a float register and the kernel read whatever the integer register held (``Z = X * a + Y`` answered
    garbage and NaNs). A value past the float16 range is its infinity, as a float32 scalar's ``c_float`` is."""
    try:
        packed = struct.pack("<e", value)
    except OverflowError:
        packed = struct.pack("<e", math.copysign(math.inf, value))
    return ctypes.c_uint16(struct.unpack("<H", packed)[0])
_runtime: ctypes.CDLL | None = None


def load(spec_dir: Path, spec_id: str) -> CKernel | FFIKernel:
    """Open the specialization in ``spec_dir`` (a verified snapshot). Raises ArtifactLoadError."""
    try:
        art = json.loads((spec_dir / "artifact.json").read_text())
        backend = art.get("execution_backend")
        if backend not in BACKENDS:
            raise ArtifactLoadError(f"execution backend {backend!r} cannot be loaded without TileLang's JIT "
                                    f"(supported: {', '.join(BACKENDS)})", spec_id=spec_id,
                                    hint="build with the target's default backend")
        try:
            signature = sig.read((spec_dir / "signature.json").read_text(), art.get("out_idx"))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ArtifactLoadError(f"signature.json is not a readable PrimFunc: {type(exc).__name__}: {exc}",
                                    spec_id=spec_id, hint="rebuild the release with this tileship") from exc
        if backend == "tvm_ffi":
            signature = ffi_abi(spec_dir, art, signature, spec_id)
        library = spec_dir / art["library"]
        if backend == "cython":
            return CKernel(library, signature, art["target"])
        return FFIKernel(library, signature, art["target"])
    except ArtifactLoadError:
        raise
    except Exception as exc:
        raise translate(exc, spec_id=spec_id) from exc


class _Kernel:
    backend = ""

    def __init__(self, library: Path, signature: Signature, target: str) -> None:
        self.library = library
        self.signature = signature
        self.target = target
        self.params = signature.params
        self.result_idx = list(signature.result_idx)
        self.dynamic_symbolic_map = signature.dynamic_symbolic_map
        self.adapter = self  # the fast launcher reads the fields above through ``kernel.adapter``

    def _place(self, inputs: tuple[Any, ...]) -> list[Any]:
        """Inputs in parameter order, outputs allocated from the declared shapes (dims read from the inputs)."""
        import torch

        n_in = len(self.params) - len(self.result_idx)
        if len(inputs) != n_in:
            raise ValueError(f"the kernel takes {n_in} inputs, {len(inputs)} were given")
        slots: list[Any] = [None] * len(self.params)
        it = iter(inputs)
        for i in range(len(self.params)):
            if i not in self.result_idx:
                slots[i] = next(it)
        for i, p in enumerate(self.params):
            if not p.is_scalar and i not in self.result_idx and isinstance(slots[i], torch.Tensor):
                self._check(i, p, slots[i])
        device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), torch.device("cpu"))
        for i in self.result_idx:
            shape = [self._dim(d, slots) for d in self.params[i].shape or ()]
            slots[i] = torch.empty(shape, dtype=self.params[i].torch_dtype(), device=device)
        return slots

    def _dim(self, d: int | Sym | sig.Expr, slots: list[Any]) -> int:
        """A dim's size in this call: fixed, read from the tensor that binds its symbol, or computed from
        those (an output declared ``(M, N * 2)``). ValueError for a symbol no input binds."""
        def symbol(s: Sym) -> int:
            if s not in self.dynamic_symbolic_map:
                raise ValueError(f"the kernel's dim {s.name} is bound by no input tensor")
            kind, buf, axis, scale = self.dynamic_symbolic_map[s]
            t = slots[buf]
            return int(t.shape[axis]) if kind == 0 else int(t.stride(axis)) * scale

        return sig.dim_value(d, symbol)

    def _check(self, i: int, p: sig.Param, t: Any) -> None:
        if t.dtype != p.torch_dtype():
            raise ValueError(f"parameter {p.name}: dtype {t.dtype}, the kernel's is {p.dtype}")
        shape = p.shape or ()
        mismatch = len(t.shape) != len(shape)
        if mismatch or any(isinstance(d, int) and d != n for d, n in zip(shape, t.shape, strict=True)):
            raise ValueError(f"parameter {p.name}: shape {tuple(t.shape)}, the kernel's is "
                             f"{tuple(str(d) for d in shape)}")

    def _outputs(self, slots: list[Any]) -> Any:
        """The output, a list of several, or None for a kernel with none (it updates inputs in place)."""
        outs = [slots[i] for i in self.result_idx]
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs


class CKernel(_Kernel):
    """A "c"-target specialization: TileLang's host wrapper library, called through ctypes."""

    backend = "cython"

    def __init__(self, library: Path, signature: Signature, target: str) -> None:
        super().__init__(library, signature, target)
        self.lib = ctypes.CDLL(str(library))
        self.lib.get_last_error.restype = ctypes.c_char_p
        if self.lib.init() != 0:
            raise RuntimeError(f"the library's init failed: {self.lib.get_last_error().decode(errors='replace')}")
        self._call = self.lib.call
        self._call.restype = ctypes.c_int32

    def __call__(self, *inputs: Any) -> Any:
        import torch

        slots = self._place(inputs)
        args: list[Any] = []
        for p, v in zip(self.params, slots, strict=True):
            if isinstance(v, torch.Tensor):
                args.append(ctypes.c_void_p(v.data_ptr()))
            elif p.is_scalar:
                args.append(_half_bits(v) if p.dtype == "float16" else _SCALAR_CTYPES[p.dtype](v))
            else:
                raise ValueError(f"parameter {p.name}: a tensor is required, got {type(v).__name__}")
        args.extend(ctypes.c_int64(self._dim(s, slots)) for s, _ in self.signature.dynamic)
        args.append(ctypes.c_void_p(0))  # the stream: none on the CPU
        rc = self._call(*args)
        if rc != 0:
            raise RuntimeError(f"kernel call failed ({rc}): {self.lib.get_last_error().decode(errors='replace')}")
        return self._outputs(slots)


class FFIKernel(_Kernel):
    """A tvm-ffi specialization (CUDA): the library's ``main`` through the tvm-ffi runtime module."""

    backend = "tvm_ffi"

    def __init__(self, library: Path, signature: Signature, target: str) -> None:
        super().__init__(library, signature, target)
        import tvm_ffi

        _load_tvm_runtime()
        self.executable = tvm_ffi.load_module(str(library))
        self._ffi_callee_allocated_output_abi = signature.callee_allocated_outputs

    def _get_executable(self) -> Any:
        return self.executable

    def __call__(self, *inputs: Any) -> Any:
        import torch

        if self._ffi_callee_allocated_output_abi:
            anchor = next((a for a in inputs if isinstance(a, torch.Tensor)), None)
            if anchor is None:
                anchor = torch.empty(0, device="cuda")
            res = self.executable(*inputs, anchor)
            return res if len(self.result_idx) == 1 else list(res)
        slots = self._place(inputs)
        self.executable(*slots)
        return self._outputs(slots)


_NUM_ARGS = re.compile(r'"main: num_args should be (\d+)"')


def ffi_abi(spec_dir: Path, art: dict[str, Any], signature: Signature, spec_id: str) -> Signature:
    """The tvm-ffi calling convention, checked against the library's own argument count.

    Whether the library allocates its outputs (``callee_allocated_outputs``) is read from
    ``artifact.json`` (what the compile decided), else from the signature's stamp; a bundle that
    names neither was built by a tileship that did not record it, and TileLang 0.1.x's CUDA
    backend makes every kernel with outputs callee-allocated. The generated host code states how
    many arguments ``main`` takes (``host_kernel.cu``); a convention that disagrees with it is an
    ArtifactLoadError here, never a kernel that writes its output into an input at call time."""
    callee = art.get("callee_allocated_outputs")
    if callee is None:
        callee = signature.callee_allocated_outputs or bool(signature.result_idx)
    signature = dataclasses.replace(signature, callee_allocated_outputs=bool(callee) and bool(signature.result_idx))
    n = len(signature.params)
    want = n - len(signature.result_idx) + 1 if signature.callee_allocated_outputs else n
    host = spec_dir / "host_kernel.cu"
    found = _NUM_ARGS.search(host.read_text(errors="replace")) if host.is_file() else None
    if found is not None and int(found.group(1)) != want:
        raise ArtifactLoadError(
            f"the library's main takes {found.group(1)} arguments, the signature gives {want} "
            f"({'callee' if signature.callee_allocated_outputs else 'caller'}-allocated outputs, "
            f"{n} parameters, {len(signature.result_idx)} outputs)", spec_id=spec_id,
            hint="rebuild the release with this tileship")
    return signature


def _load_tvm_runtime() -> None:
    """dlopen, once and with global symbols, the two native libraries of the installed TileLang wheel
    that a tvm-ffi CUDA library needs at load and first call: ``libtvm_runtime.so`` registers the
    CUDA module loader (``ffi.Module.load_from_bytes.cuda``) and ``__tvm_set_device``;
    ``libtilelang.so`` registers the TMA descriptor helpers (``__tvm_tensormap_create_tiled`` /
    ``_im2col``) that TileLang's generated host code looks up by name. ``libtilelang.so`` links TVM's
    native compiler (``libtvm_compiler.so``), so its functions are mapped and registered in tvm-ffi's
    function registry, reachable only by name through ``tvm_ffi.get_global_func``: no Python module
    of TileLang or TVM is imported. ``find_spec`` locates the package without running it."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            return
        spec = importlib.util.find_spec("tilelang")
        if spec is None or not spec.submodule_search_locations:
            raise OSError("TileLang is not installed: its native runtime libraries load tvm-ffi CUDA modules")
        libdir = Path(next(iter(spec.submodule_search_locations))) / "lib"
        runtime = ctypes.CDLL(str(libdir / "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(libdir / "libtilelang.so"), mode=ctypes.RTLD_GLOBAL)
        _runtime = runtime


__all__ = ["BACKENDS", "CKernel", "FFIKernel", "ffi_abi", "load"]
