"""No-JIT guard: while installed, every TileLang compile entry point raises CompileForbidden.

TileLang has no "never compile" mode: on a cache miss it compiles silently. Serving must
never do that, so the runtime installs this guard before loading a release. Attempts are
counted (``attempts()``) and exported as a metric that must stay 0.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from tileship.errors import CompileForbidden

_lock = threading.Lock()
_attempts = 0
_installed = False


def attempts() -> int:
    return _attempts


def _forbid(where: str) -> Callable[..., Any]:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        global _attempts
        with _lock:
            _attempts += 1
        raise CompileForbidden(f"TileLang tried to compile ({where}) while a release was serving",
                               hint="the call needs a specialization the release does not hold: add its shape and "
                                    "rebuild")

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
#: modules that could not be imported here (so nothing can call into them): name -> why
unavailable: dict[str, str] = {}


def install() -> None:
    """Idempotent. Imports TileLang (the caller has set a cache dir) and every module of ``GUARDED``,
    patches each entry point, then every alias of it in any loaded ``tilelang`` module
    (``tilelang.compile``, ``tilelang.lower``, ``tilelang.contrib.compile_cuda``, ...)."""
    global _installed
    if _installed:
        return
    import importlib

    import tilelang  # noqa: F401

    originals: dict[int, str] = {}
    for module, attr in GUARDED:
        try:
            owner: Any = importlib.import_module(module)
        except Exception as exc:  # an optional backend (cuda-python, cutlass) that is not installed
            unavailable[module] = f"{type(exc).__name__}: {exc}"
            continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        where = f"{module}.{attr}"
        fn = getattr(owner, name)
        originals[id(fn)] = where
        setattr(owner, name, _forbid(where))
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "tilelang" or mod_name.startswith("tilelang.")):
            continue
        for key, value in list(vars(mod).items()):
            if id(value) in originals and callable(value):
                setattr(mod, key, _forbid(f"{mod_name}.{key} (alias of {originals[id(value)]})"))
    _installed = True
