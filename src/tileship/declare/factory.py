"""Kernel factories in every form a TileLang user writes them, resolved in one place.

Forms (``FactoryInfo.form``):
    function   a plain function returning a ``T.prim_func`` (defined here or imported)
    jit        a ``@tilelang.jit`` object (lazy: the function returns the prim_func; eager-style
               bodies that allocate outputs with ``T.empty`` included; eager kernels whose tensors
               are function parameters, ``def k(A, B, block): M, N = T.const("M, N"); A: T.Tensor(...)``,
               take their ``T.const`` dims as keywords: ``tensor_params`` names the tensors)
    autotune   an ``@autotune``-wrapped jit object: built with ``Operator.config``, no search

``resolve`` finds the TIR builder, the real signature (for jit objects, the wrapped function's),
the source files and the decorator's ``pass_configs``/``out_idx`` without importing TileLang and
without raising anything but DeclarationError. ``trace`` calls the builder for one
specialization (build workers and benchmark children) and ``out_idx`` reconciles the declared
outputs with the kernel's own ``tilelang_out_idx``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath, PurePosixPath
from typing import Any

from tileship.errors import DeclarationError

FORMS = ("function", "jit", "autotune")
#: TileLang's refusal when an eager kernel's ``T.const`` dim is given no value
_MISSING_CONST = re.compile(r"Cannot find value for constexpr variable `([^`]+)`")
#: what ``dynamic_name`` appends to a ``T.dynamic`` var's name that the kernel's parameters (or C) already use
_DYN = "_dyn"


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
    #: an eager ``@tilelang.jit`` kernel's tensor parameters (``def k(A, B, block)`` with ``A: T.Tensor(...)``
    #: in the body): TileLang binds them from the annotations, so they are never passed, and the dims
    #: (``T.const``) are passed as keywords the signature does not list; empty for every other form
    tensor_params: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Deterministic across machines: sources as module-relative posix paths."""
        module = self.qualname.rpartition(".")[0]
        return {"form": self.form, "function": self.qualname,
                "sources": [module_relative(f, module) for f in self.source_files],
                "decorator_pass_configs": {k: _plain(v) for k, v in sorted(self.decorator_pass_configs.items())},
                "decorator_out_idx": _plain(self.decorator_out_idx),
                # only eager kernels with tensor parameters carry the key: the others' descriptions are unchanged
                **({"tensor_params": list(self.tensor_params)} if self.tensor_params else {})}


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
    tensors: tuple[str, ...] = ()
    if impl is not None:
        fn = getattr(impl.func, "orig_func", impl.func)
        sig = getattr(impl, "signature", None) or _signature(fn)
        pcs = dict(getattr(impl, "pass_configs", None) or {})
        out_idx = getattr(impl, "out_idx", None)
        # TileLang's JITFunc knows an eager kernel's tensor parameters from the decoration on (no trace)
        tensors = tuple(str(n) for n in (getattr(impl.func, "tensor_args", None) or {}))
    else:
        fn, sig, pcs, out_idx = factory, _signature(factory), {}, None
    module = getattr(fn, "__module__", "?")
    return FactoryInfo(form, builder, fn, sig, f"{module}.{getattr(fn, '__qualname__', '?')}",
                       tuple(f for f in (_source_file(fn),) if f), pcs, out_idx, tensors)


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
    when the factory does not return one.

    The ``T.dynamic`` var is named by the dim in lower case (``"k"`` for ``K``), unless the kernel names a
    parameter so (a tensor ``k``, a scalar ``n``) or C reserves the word: the generated C declares both
    (``conflicting declaration 'int32_t k'``), so the kernel is traced again with ``dynamic_name``'s suffix. A var
    the kernel names itself so (an eager kernel's ``K = T.dynamic("k")`` beside a tensor ``k``) is renamed in the
    traced function (``var_names.rename_clashing``: BuildError where it cannot be)."""
    from tileship.declare import var_names
    from tileship.declare.c_target import C_RESERVED

    info = resolve(op.factory, operator=op.name)
    dynamic = [d for d, v in spec.dims if isinstance(v, tuple)]
    names = {d: d.lower() for d in dynamic}
    func = _trace_once(op, spec, info, names)
    taken = C_RESERVED | param_names(func)
    if any(n in taken for n in names.values()):
        func = _trace_once(op, spec, info, {d: dynamic_name(d, taken) for d in dynamic})
    return var_names.rename_clashing(func, spec.id)  # the kernel's own T.dynamic vars (an eager kernel's)


def dynamic_name(dim: str, taken: Any = frozenset()) -> str:
    """The name of the ``T.dynamic`` var passed for ``dim``: ``dim.lower()``, with ``_dyn`` appended until it is
    not in ``taken`` (the kernel's parameter names and the words C reserves)."""
    name = dim.lower()
    while name in taken:
        name += _DYN
    return name


def is_dynamic_name(name: str, dim: str) -> bool:
    """Whether ``name`` is one ``dynamic_name`` gives ``dim``."""
    while name.endswith(_DYN) and name != dim.lower():
        name = name.removesuffix(_DYN)
    return name == dim.lower()


def param_names(func: Any) -> frozenset[str]:
    """Every name the kernel's parameters carry: the parameter var, its buffer and the buffer's data var."""
    out = set()
    for p in func.params:
        out.add(str(p.name))
        buf = func.buffer_map.get(p)
        if buf is not None:
            out.update((str(buf.name), str(buf.data.name)))
    return frozenset(out)


def _positional_only(info: FactoryInfo, kwargs: dict[str, Any]) -> list[Any]:
    """The values of the factory's positional-only parameters (``def f(M, N, /, dtype)``), in order, taken out of
    ``kwargs`` (a default where the declaration passes none): Python refuses them as keywords."""
    args: list[Any] = []
    for p in (info.signature.parameters.values() if info.signature is not None else ()):
        if p.kind is not p.POSITIONAL_ONLY or (p.name not in kwargs and p.default is p.empty):
            break
        args.append(kwargs.pop(p.name) if p.name in kwargs else p.default)
    return args


def _trace_once(op: Any, spec: Any, info: FactoryInfo, names: Mapping[str, str]) -> Any:
    import tilelang.language as T

    from tileship.errors import BuildError

    kwargs: dict[str, Any] = {**op.config, **dict(getattr(spec, "config", ()))}  # a candidate's config over the op's
    for dtype_param in op.dtype_params():
        kwargs[dtype_param] = spec.dtype
    for d, v in spec.dims:
        kwargs[op.factory_param(d)] = T.dynamic(names[d]) if isinstance(v, tuple) else v
    try:
        func = info.builder(*_positional_only(info, kwargs), **kwargs)
    except ValueError as exc:
        const = _MISSING_CONST.match(str(exc))
        if not info.tensor_params or const is None:
            raise
        raise BuildError(f"the kernel's T.const dim {const.group(1)} is none of the declared dims "
                         f"({', '.join(op.dims)}): an eager kernel takes its dims by their T.const names",
                         spec_id=spec.id, hint=f'name the dim {const.group(1)} in the declaration, or map it: '
                         f'params={{"<declared dim>": "{const.group(1)}"}}') from None
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


def decorator_out_idx(info: FactoryInfo, func: Any) -> list[int] | None:
    """The parameter positions ``@tilelang.jit(out_idx=...)`` (an int or a list, negative from the end) makes
    the traced ``func``'s outputs, non-negative and sorted; None when the decorator names none."""
    raw = info.decorator_out_idx
    if raw is None:
        return None
    n = len(func.params)
    return sorted(int(i) % n for i in ([raw] if isinstance(raw, int) else raw))


def reconcile_out_idx(op: Any, info: FactoryInfo, func: Any) -> tuple[list[int] | None, list[int]]:
    """(``out_idx`` to pass to ``tilelang.compile`` or None to let the kernel's attribute speak,
    the output positions).

    The kernel says where its outputs are when it can: its ``T.empty`` tensors (``tilelang_out_idx``),
    else its decorator's ``@tilelang.jit(out_idx=...)``. The declared outputs take those positions in
    order and the declared inputs the others, as TileLang's own ``kernel(*inputs)`` does, so an output
    need not be the last parameter (``out_idx=[-3]`` before two buffers updated in place). A kernel that
    says nothing takes its outputs where the declared names sit among its parameters, else at the tail.
    ``declare.contract`` then holds every position to its declared name, rank, sizes and dtype. Raises
    BuildError when the declaration and the kernel disagree on how many outputs there are."""
    from tileship.errors import BuildError

    attr = kernel_out_idx(func)
    deco = decorator_out_idx(info, func)
    own = attr if attr is not None else deco
    if op.infers_outputs:
        if own is None:
            raise BuildError("outputs= is omitted but the kernel allocates no outputs with T.empty",
                             hint="declare outputs=(TensorArg(...), ...) for the kernel's output parameters")
        return (None if attr is not None else own), own
    declared = [a.name for a in op.outputs]
    if own is None:
        positions = _named_positions(op, func) or op.out_idx
        return positions, positions
    if len(own) != len(declared):
        where = (f"the kernel's T.empty outputs are parameters {own}" if attr is not None
                 else f"@tilelang.jit(out_idx={info.decorator_out_idx!r}) makes parameters {own} its outputs")
        names = ", ".join(_param_name(func, i) for i in own)
        raise BuildError(f"outputs= declares {len(declared)} outputs ({', '.join(declared) or 'none'}) but {where} "
                         f"({names})", hint="declare one TensorArg in outputs= per output of the kernel, in order")
    return (None if attr is not None else own), own


def _param_name(func: Any, i: int) -> str:
    p = func.params[i]
    buf = func.buffer_map.get(p)
    return str(buf.name) if buf is not None else str(p.name)


def _named_positions(op: Any, func: Any) -> list[int] | None:
    """The positions of the declared outputs among the kernel's parameters, by name, when the declaration
    names exactly the kernel's parameters and its inputs in the kernel's order; None otherwise."""
    names = [_param_name(func, i) for i in range(len(func.params))]
    outs = [a.name for a in op.outputs]
    if sorted(names) != sorted([a.name for a in op.inputs] + outs) or len(set(names)) != len(names):
        return None
    positions = [names.index(o) for o in outs]
    if positions != sorted(positions) or [x for x in names if x not in outs] != [a.name for a in op.inputs]:
        return None  # another order: declare.contract names what differs
    return positions
