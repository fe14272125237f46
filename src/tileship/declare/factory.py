"""Kernel factories in every form a TileLang user writes them, resolved in one place.

Forms (``FactoryInfo.form``):
    function   a plain function returning a ``T.prim_func`` (defined here or imported)
    jit        a ``@tilelang.jit`` object (lazy: the function returns the prim_func; eager-style
               bodies that allocate outputs with ``T.empty`` included)
    autotune   an ``@autotune``-wrapped jit object: built with ``Operator.config``, no search

``resolve`` finds the TIR builder, the real signature (for jit objects, the wrapped function's),
the source files and the decorator's ``pass_configs``/``out_idx`` without importing TileLang and
without raising anything but DeclarationError. ``trace`` calls the builder for one
specialization (build workers and benchmark children) and ``out_idx`` reconciles the declared
outputs with the kernel's own ``tilelang_out_idx``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath, PurePosixPath
from typing import Any

from tileship.errors import DeclarationError

FORMS = ("function", "jit", "autotune")


@dataclass(frozen=True)
class FactoryInfo:
    form: str
    #: called with keyword arguments, returns the PrimFunc (``get_tir`` for jit objects)
    builder: Callable[..., Any]
    #: the function the user wrote (a jit object's wrapped function)
    function: Callable[..., Any]
    signature: inspect.Signature | None
    #: ``module.qualname`` of the function the user wrote
    qualname: str
    source_files: tuple[str, ...]
    decorator_pass_configs: Mapping[str, Any] = field(default_factory=dict)
    decorator_out_idx: Any = None

    def to_json(self) -> dict[str, Any]:
        """Deterministic across machines: sources as module-relative posix paths."""
        module = self.qualname.rpartition(".")[0]
        return {"form": self.form, "function": self.qualname,
                "sources": [module_relative(f, module) for f in self.source_files],
                "decorator_pass_configs": {k: _plain(v) for k, v in sorted(self.decorator_pass_configs.items())},
                "decorator_out_idx": _plain(self.decorator_out_idx)}


def module_relative(path: str, module: str) -> str:
    """``tileship/catalog/cpu.py`` for the file of module ``tileship.catalog.cpu`` wherever it lies."""
    p = PurePath(path)
    parts = module.split(".") if module else []
    n = len(parts) if p.stem != "__init__" else len(parts) + 1
    return PurePosixPath(*p.parts[-n:]).as_posix() if 0 < n <= len(p.parts) else p.name


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def resolve(factory: Any, *, operator: str = "<unnamed>") -> FactoryInfo:
    """Which form ``factory`` is and how to build its TIR. Raises DeclarationError (field
    ``factory``) for anything that is not a factory."""
    form, builder, impl = "function", factory, None
    if hasattr(factory, "jit_impl") and hasattr(factory.jit_impl, "get_tir"):  # AutoTuneImpl
        form, impl = "autotune", factory.jit_impl
        builder = impl.get_tir
    elif hasattr(factory, "get_tir") and hasattr(factory, "func"):  # JITImpl
        form, impl = "jit", factory
        builder = impl.get_tir
    elif not callable(factory):
        raise DeclarationError(f"factory is a {type(factory).__name__}, not a kernel factory", operator=operator,
                               field="factory",
                               hint="pass the function that returns the T.prim_func, or its @tilelang.jit object")
    elif _is_primfunc(factory):
        raise DeclarationError("factory is a PrimFunc, not a factory", operator=operator, field="factory",
                               hint="pass the function that builds it (def f(M, N, dtype): ... return main)")
    if impl is not None:
        fn = getattr(impl.func, "orig_func", impl.func)
        sig = getattr(impl, "signature", None) or _signature(fn)
        pcs = dict(getattr(impl, "pass_configs", None) or {})
        out_idx = getattr(impl, "out_idx", None)
    else:
        fn, sig, pcs, out_idx = factory, _signature(factory), {}, None
    module = getattr(fn, "__module__", "?")
    return FactoryInfo(form, builder, fn, sig, f"{module}.{getattr(fn, '__qualname__', '?')}",
                       tuple(f for f in (_source_file(fn),) if f), pcs, out_idx)


def _is_primfunc(obj: Any) -> bool:
    return type(obj).__name__ == "PrimFunc" and hasattr(obj, "buffer_map")


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _source_file(fn: Any) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, OSError):
        return None


def trace(op: Any, spec: Any) -> Any:
    """The PrimFunc of ``op`` for ``spec`` (``T.dynamic`` for the dynamic dim). Raises BuildError
    when the factory does not return one."""
    import tilelang.language as T

    from tileship.errors import BuildError

    info = resolve(op.factory, operator=op.name)
    kwargs: dict[str, Any] = {**op.config, **dict(getattr(spec, "config", ()))}  # a candidate's config over the op's
    dtype_param = op.factory_param("dtype")
    if dtype_param is not None:
        kwargs[dtype_param] = spec.dtype
    for d, v in spec.dims:
        kwargs[op.factory_param(d)] = T.dynamic(d.lower()) if isinstance(v, tuple) else v
    func = info.builder(**kwargs)
    if not _is_primfunc(func) and hasattr(func, "get_tir"):  # a function returning a lazy jit object
        func = func.get_tir()
    if not _is_primfunc(func):
        raise BuildError(f"the factory {info.qualname} returned {type(func).__name__}, not a PrimFunc", spec_id=spec.id,
                         hint="return the @T.prim_func (or pass the @tilelang.jit object itself as factory=)")
    return func


def kernel_out_idx(func: Any) -> list[int] | None:
    """The traced kernel's own ``tilelang_out_idx`` (outputs allocated with ``T.empty``), as
    non-negative parameter positions; None when it declares none."""
    attrs = func.attrs
    if not attrs or "tilelang_out_idx" not in attrs:
        return None
    n = len(func.params)
    return sorted(int(i) % n for i in attrs["tilelang_out_idx"])


def reconcile_out_idx(op: Any, info: FactoryInfo, func: Any) -> tuple[list[int] | None, list[int]]:
    """(``out_idx`` to pass to ``tilelang.compile`` or None to let the kernel's attribute speak,
    the output positions). Raises BuildError naming both when the declaration and the kernel
    (or its decorator) disagree."""
    from tileship.errors import BuildError

    n = len(func.params)
    attr = kernel_out_idx(func)
    own = attr
    declared = None if op.infers_outputs else op.out_idx
    if info.decorator_out_idx is not None:
        raw = info.decorator_out_idx
        deco = sorted(int(i) % n for i in ([raw] if isinstance(raw, int) else raw))
        if declared is not None and deco != declared:
            raise BuildError(f"outputs= declares parameters {declared} as outputs but @tilelang.jit(out_idx={raw!r}) "
                             f"says {deco}", hint="make outputs= list the decorator's outputs, or drop one of the two")
        own = own or deco
    if own is not None and declared is not None and own != declared:
        raise BuildError(f"outputs= declares parameters {declared} as outputs but the kernel's T.empty outputs are "
                         f"{own} "
                         f"(tilelang_out_idx)",
                         hint="make outputs= match the kernel's T.empty tensors in order, or omit outputs=")
    if own is None and declared is None:
        raise BuildError("outputs= is omitted but the kernel allocates no outputs with T.empty",
                         hint="declare outputs=(TensorArg(...), ...) for the kernel's trailing parameters")
    positions = own if own is not None else declared
    assert positions is not None
    return (None if attr is not None else positions), positions
