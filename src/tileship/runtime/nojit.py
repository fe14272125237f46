"""No-JIT guard: while installed, every TileLang compile entry point raises CompileForbidden.

TileLang has no "never compile" mode: on a cache miss it compiles silently. Serving must
never do that, so the runtime installs this guard before loading a release. Attempts are
counted (``attempts()``) and exported as a metric that must stay 0.

The guard imports nothing: the loader never imports TileLang (``runtime.artifact``), so a
serving process normally holds none of its compile modules. Whatever imports TileLang anyway
(an operator module whose reference sits next to its ``@T.prim_func`` factory) gets every
module of ``GUARDED`` patched by an import hook the moment it has executed, and every alias
of a guarded function replaced, whether the module was imported before ``install`` or after.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from tileship.errors import CompileForbidden

_lock = threading.RLock()  # install and the import hook (an import under the hook may import again)
_count_lock = threading.Lock()
_attempts = 0
_installed = False


def attempts() -> int:
    return _attempts


def _forbid(where: str) -> Callable[..., Any]:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        global _attempts
        with _count_lock:
            _attempts += 1
        raise CompileForbidden(f"TileLang tried to compile ({where}) while a release was serving", where=where,
                               hint="the call needs a specialization the release does not hold: add its shape and "
                                    "rebuild")

    raiser._tileship_guard = True  # type: ignore[attr-defined]
    return raiser


#: every compile entry point of the installed TileLang (module, attribute path); ``tests/test_nojit_guard.py``
#: enumerates them from TileLang's sources and fails when one appears that is neither here nor reviewed
GUARDED = (
    ("tilelang.jit.kernel", "JITKernel._compile_and_create_adapter"),
    ("tilelang.cache.kernel_cache", "KernelCache.cached"),
    ("tilelang.jit.adapter.libgen", "LibraryGenerator.compile_lib"),
    ("tilelang.jit.adapter.nvrtc.libgen", "NVRTCLibraryGenerator.compile_lib"),
    ("tilelang.jit.adapter.cutedsl.libgen", "CuTeDSLLibraryGenerator.compile_lib"),
    ("tilelang.jit", "compile"),
    ("tilelang.jit", "JITImpl.compile"),
    ("tilelang.engine.lower", "lower"),
    ("tilelang.engine.lower", "lower_with_context"),
    ("tilelang.engine.lower", "lower_to_host_device_ir"),
    ("tilelang.contrib.nvcc", "compile_cuda"),
    ("tilelang.contrib.nvrtc", "compile_cuda"),
    ("tilelang.contrib.hipcc", "compile_hip"),
    ("tilelang.contrib.bisheng", "compile_ascend"),
    ("tilelang.autotuner.tuner", "AutoTuneImpl.compile"),
    ("tilelang.autotuner.grouped_compile", "compile_grouped_unit_tvm_ffi"),
    ("tilelang.tools.compile_only", "compile_kernel_source"),
)
#: modules that could not be imported here (so nothing can call into them): name -> why; filled by
#: ``import_all`` (the enumeration test), never by ``install``, which imports nothing
unavailable: dict[str, str] = {}
#: every original compile function the guard replaced, by id (kept alive so an id is never reused):
#: an alias of one found in any ``tilelang`` module is replaced too
_originals: dict[int, tuple[str, Any]] = {}
_by_module: dict[str, list[str]] = {}
for _module, _attr in GUARDED:
    _by_module.setdefault(_module, []).append(_attr)


def install() -> None:
    """Idempotent; imports nothing. Patches each entry point of ``GUARDED`` whose module is already
    imported, replaces every alias of one in the loaded ``tilelang`` modules (``tilelang.compile``,
    ``tilelang.lower``, ``tilelang.contrib.compile_cuda``, ...), and puts an import hook first on
    ``sys.meta_path`` that does the same to each ``tilelang`` module the moment it finishes executing:
    a compile module imported after the guard went up is patched before any code can bind it, so
    its aliases (bound by the importing package afterwards) are the guard too."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        sys.meta_path.insert(0, _Hook())
        for name in [m for m in list(sys.modules) if _is_tilelang(m)]:
            if name in _by_module and sys.modules.get(name) is not None:
                _patch(name, sys.modules[name])
        for name, mod in list(sys.modules.items()):
            if mod is not None and _is_tilelang(name):
                _sweep(name, mod)


def import_all() -> dict[str, str]:
    """Import every module of ``GUARDED`` (TileLang's compilers included: for tests and
    diagnostics, never on the serving path); returns ``unavailable``: module -> why not."""
    import importlib

    for module in _by_module:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an optional backend (cuda-python, cutlass) that is not installed
            unavailable[module] = f"{type(exc).__name__}: {exc}"
    return dict(unavailable)


def _is_tilelang(name: str) -> bool:
    return name == "tilelang" or name.startswith("tilelang.")


def _patch(name: str, module: Any) -> None:
    for attr in _by_module.get(name, ()):
        owner: Any = module
        *path, last = attr.split(".")
        try:
            for part in path:
                owner = getattr(owner, part)
            fn = getattr(owner, last)
        except AttributeError:  # the enumeration test names what this TileLang lacks
            continue
        if getattr(fn, "_tileship_guard", False):
            continue
        where = f"{name}.{attr}"
        _originals[id(fn)] = (where, fn)
        setattr(owner, last, _forbid(where))


def _sweep(name: str, module: Any) -> None:
    for key, value in list(vars(module).items()):
        hit = _originals.get(id(value))
        if hit is not None and hit[1] is value:
            setattr(module, key, _forbid(f"{name}.{key} (alias of {hit[0]})"))


def _after_exec(module: Any) -> None:
    name = module.__name__
    with _lock:
        if name in _by_module:
            _patch(name, module)
        _sweep(name, module)


class _Hook:
    """A meta-path finder for ``tilelang`` modules: the real finders find them; their loader is
    wrapped so that the guard patches each module as soon as it has executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not _is_tilelang(name):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _GuardedLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


class _GuardedLoader:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _after_exec(module)

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, get_resource_reader, ...
        return getattr(self._inner, attr)
