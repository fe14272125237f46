"""The dispatcher's hot path in compiled code: a key table in C that launches compiled kernels.

``native/fastcall.c`` (built by ``tileship build`` into the release as ``native/fastcall.so``, never at
load time) keeps, per operator, a table from a call's key (each tensor's device, dtype, rank and shape)
to what serves it. Called with the operator's tensors, the table computes the key in C, checks
contiguity and 16-byte alignment, and launches the kernel: one tvm-ffi call from Python, no Python
key, no Python launcher. What it cannot serve it answers with an int, and the Python dispatcher
(``runtime.dispatch``) takes over:

    < 0   MISS (-1: no row for this key, or the tensors came without torch's allocator, e.g. NumPy
          arrays), NON_CONTIGUOUS (-2), MISALIGNED (-3), NO_DATA (-4: a null data pointer, a FakeTensor's)
    >= 0  a route row: the index of the memoized ``Route`` that serves the key in Python (the
          reference, or a Python launcher)

Rows are written by the Python dispatcher only, for keys it has memoized and resolved (a kernel row,
or a route row), and all of them are dropped whenever a decision changes (``OpRunner.disable``, the
circuit breaker, ``forget``, an assignment to ``Entry.kernel``): the table never serves a key
differently from the Python path (``runtime.table_rows``). Kernel calls it serves are counted in C,
per entry (``Entry.native_calls``).

With ``out=`` (one output) the table is called as OUT, ``(6, out, *tensors)``: the kernel's output
allocation is handed ``out`` itself (the thread's DLPack allocator, swapped for the call), so the
kernel writes there with no second launch; an ``out`` it cannot take (strided, misaligned, sharing bytes
with an input) gets the kernel's own output copied in, as the Python path does.

Two kinds of kernels are served this way, each with one output or none: those TileLang's ``tvm_ffi``
backend built (CUDA; the kernel allocates its output, the callee-allocated ABI), and "c"-target
kernels (TileLang's cython library: the table allocates the output through the caller's tensor
allocator and calls the library's ``call`` with the data pointers and the key's symbolic dims, all
fixed per key). The rest keep the Python launchers.
``TILESHIP_NATIVE_CALL=off`` loads no table. Nothing here raises on load: ``attach`` returns why
no table serves, as a note.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship import env

SOURCE = Path(__file__).with_name("native") / "fastcall.c"
#: where the release keeps the library (a release file: hashed in the manifest, checked before load)
LIBRARY = "native/fastcall.so"
ABI = 3
MAX_ARGS = 16
MAX_CALL = 24  # pointers + symbolic dims + the stream of a "c"-target call (fastcall.c)
MAX_OUT_NDIM = 16
MISS, NON_CONTIGUOUS, MISALIGNED, NO_DATA = -1, -2, -3, -4
#: the reference's reason for each code a table answers with instead of launching (an older library never says NO_DATA)
REASONS = {NON_CONTIGUOUS: "non_contiguous", MISALIGNED: "misaligned", NO_DATA: "no_data"}
_log = logging.getLogger("tileship.runtime.native")
_modules: dict[str, Any] = {}


@dataclass(frozen=True)
class NativeBuild:
    """The outcome of compiling the library: ``error`` empty when ``ok``."""

    ok: bool
    compiler: str = ""
    seconds: float = 0.0
    error: str = ""
    source_sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        """What the release records (no timing: this is part of the release's identity)."""
        return {"ok": self.ok, "compiler": self.compiler, "source": f"sha256:{self.source_sha256}",
                **({"error": self.error} if self.error else {})}


def compile_library(dest: Path) -> NativeBuild:
    """Compile ``fastcall.c`` into ``dest`` with the C compiler (``CC``, else ``cc``/``gcc``) against
    the tvm-ffi headers of this environment. Never raises: a failure is a value and no file is left."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    cc = env.c_compiler() or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return NativeBuild(False, error="no C compiler (set CC)", source_sha256=digest)
    try:
        import tvm_ffi.libinfo as libinfo

        includes = [libinfo.find_include_path(), libinfo.find_dlpack_include_path()]
    except Exception as exc:  # tvm-ffi missing or laid out differently
        return NativeBuild(False, error=f"tvm-ffi headers not found: {type(exc).__name__}: {exc}",
                           source_sha256=digest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    cmd = [cc, "-O2", "-std=c11", "-shared", "-fPIC", "-Wl,--build-id=sha1",
           *[f"-I{p}" for p in includes], str(SOURCE), "-o", str(tmp), "-lpthread"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout.splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        return NativeBuild(False, error=f"{type(exc).__name__}: {exc}", source_sha256=digest)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        text = (proc.stderr or proc.stdout).replace(str(dest.parent), dest.parent.name)  # no temp paths
        return NativeBuild(False, compiler=" ".join(version), seconds=time.perf_counter() - t0,
                           error=text[-2000:], source_sha256=digest)
    tmp.replace(dest)
    return NativeBuild(True, compiler=" ".join(version), seconds=time.perf_counter() - t0, source_sha256=digest)


def load_module(path: Path) -> Any:
    """The loaded library at ``path`` (once per path and process). Raises on failure (callers catch)."""
    key = str(path)
    mod = _modules.get(key)
    if mod is None:
        import tvm_ffi

        mod = tvm_ffi.load_module(key)
        abi = mod.get_function("fastcall_abi")()
        if abi != ABI:
            raise RuntimeError(f"{path}: fastcall ABI {abi}, this tileship speaks {ABI}")
        _modules[key] = mod
    return mod


class NativeTable:
    """One operator's table: ``call`` is the tvm-ffi Function the dispatcher calls per call."""

    __slots__ = ("call", "module", "n_args")

    def __init__(self, module: Any, n_args: int, n_slots: int) -> None:
        self.call = module.get_function("fastcall_table")(n_args, max(1, n_slots))
        self.module = module  # the loaded library (kept alive with the table)
        self.n_args = n_args

    def put_kernel(self, slot: int, fn: Any, anchor: bool, args: tuple[Any, ...]) -> None:
        """Route the key of ``args`` to the kernel entry function ``fn``, counted under ``slot``."""
        self.call(1, slot, fn, 1 if anchor else 0, *args)

    def put_reference(self, route_id: int, args: tuple[Any, ...]) -> None:
        """Answer the key of ``args`` with ``route_id`` (the reference serves it)."""
        self.call(1, route_id, None, 0, *args)

    def put_c(self, slot: int, c_call: tuple[Any, ...], args: tuple[Any, ...]) -> bool:
        """Route the key of ``args`` to a "c"-target kernel (``runtime.launch.Launcher.c_call``), counted
        under ``slot``. False (nothing written) when the call does not fit the table's plan."""
        import torch

        addr, err, sources, dyn, out = c_call
        shape, dtype = out if out is not None else ((), None)
        code = _dl_dtypes().get(dtype) if out is not None else 0
        if code is None or len(sources) + len(dyn) + 1 > MAX_CALL or len(shape) > MAX_OUT_NDIM:
            return False
        out_param = sources.index(-1) if out is not None else -1
        plan = [len(sources), len(dyn), out_param, code, len(shape), *shape, *sources, *dyn, addr, err]
        self.call(5, slot, torch.tensor(plan, dtype=torch.int64), *args)
        return True

    def clear(self) -> None:
        self.call(2)

    def count(self, slot: int) -> int:
        return int(self.call(3, slot))

    def size(self) -> int:
        return int(self.call(4))


def attach(snapshot: Path, ops: dict[str, Any]) -> str | None:
    """Give every operator of a loaded release that has a tvm-ffi kernel its table. Returns a note
    when the release has the library but none is attached (off, failed to load), else None."""
    path = snapshot / LIBRARY
    if not path.is_file():
        return None
    if not env.native_call():
        return "TILESHIP_NATIVE_CALL=off: kernels launch through the Python dispatcher"
    wanted = [r for r in ops.values() if _has_native_kernel(r)]
    if not wanted:
        return None
    try:
        module = load_module(path)
        for runner in wanted:
            runner.use_native(NativeTable(module, runner.n_inputs, len(runner.entries)))
    except Exception as exc:  # a library this process cannot load: the Python dispatcher serves
        _log.warning("%s: not loaded (%s: %s); kernels launch through the Python dispatcher", path,
                     type(exc).__name__, exc)
        return f"{LIBRARY} not loaded ({type(exc).__name__}: {exc}): kernels launch through the Python dispatcher"
    return None


def attach_runner(snapshot: Path, runner: Any) -> bool:
    """Give one dispatcher built outside ``load`` (tune's and the benchmarks' per-candidate ones) the
    table of the release at ``snapshot``, so that it is timed as the release serves. True when
    attached; False when the release has no library, it is off, or the operator's arguments do not fit."""
    path = snapshot / LIBRARY
    if not path.is_file() or not env.native_call() or runner.n_inputs > MAX_ARGS or not runner.all_tensors:
        return False
    try:
        runner.use_native(NativeTable(load_module(path), runner.n_inputs, len(runner.entries)))
    except Exception as exc:  # as in ``attach``: the Python dispatcher serves
        _log.warning("%s: not loaded (%s: %s)", path, type(exc).__name__, exc)
        return False
    return True


def is_native(kernel: Any) -> bool:
    """True for a kernel the table launches (TileLang's tvm_ffi or cython backend)."""
    return getattr(getattr(kernel, "adapter", None), "backend", None) in ("tvm_ffi", "cython")


def _has_native_kernel(runner: Any) -> bool:
    if runner.n_inputs > MAX_ARGS or not runner.all_tensors:
        return False
    return any(is_native(e.kernel) for e in runner.entries)


@functools.cache
def _dl_dtypes() -> dict[Any, int]:
    """torch dtype -> DLPack (code | bits << 8 | lanes << 16), for the dtypes kernels here output."""
    import torch

    pairs = {torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
             torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
             torch.uint8: (1, 8), torch.bool: (6, 8), torch.float8_e4m3fn: (10, 8), torch.float8_e5m2: (12, 8)}
    return {dt: code | bits << 8 | 1 << 16 for dt, (code, bits) in pairs.items()}


__all__ = ["ABI", "LIBRARY", "MISALIGNED", "MISS", "NON_CONTIGUOUS", "NO_DATA", "REASONS", "NativeBuild", "NativeTable",
           "SOURCE", "attach", "attach_runner", "compile_library", "is_native", "load_module"]
