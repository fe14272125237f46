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


def install() -> None:
    """Idempotent. Imports TileLang (the caller has set a cache dir)."""
    global _installed
    if _installed:
        return
    import tilelang
    from tilelang.cache.kernel_cache import KernelCache
    from tilelang.jit.adapter.libgen import LibraryGenerator
    from tilelang.jit.kernel import JITKernel

    JITKernel._compile_and_create_adapter = _forbid("JITKernel._compile_and_create_adapter")  # type: ignore[method-assign]
    KernelCache.cached = _forbid("KernelCache.cached")  # type: ignore[method-assign]
    LibraryGenerator.compile_lib = _forbid("LibraryGenerator.compile_lib")  # type: ignore[method-assign]
    tilelang.compile = _forbid("tilelang.compile")
    for name in ("tilelang.contrib.nvcc",):
        mod = sys.modules.get(name)
        if mod is not None:
            mod.compile_cuda = _forbid(f"{name}.compile_cuda")  # type: ignore[attr-defined]
    _installed = True
