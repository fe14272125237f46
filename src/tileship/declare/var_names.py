"""A traced kernel's own symbolic dims renamed where its parameters (or C) already hold their names.

An eager kernel names its dynamic dims itself: ``K = T.dynamic("k")`` beside a tensor parameter ``k``, or
``N = T.dynamic("n")`` beside a scalar ``n``. TileLang's generated C then declares both under one name
(``conflicting declaration 'int32_t k'``, ``redefinition of 'int32_t n'``) and the compile fails, so the reference
served every call. (The ``T.dynamic`` var tileship itself passes a factory is named apart before the trace:
``factory.trace``.) ``rename_clashing`` gives each such var a free name with ``_dyn`` appended (``k_dyn``, as
``factory.dynamic_name`` does) through TVM's ``PrimFunc.specialize`` on a parameter's buffer whose shape holds the var
as a dim, which rewrites every use of it in the function at once; the runtime binds a dim by the var's identity,
never by its name. A var that no parameter's buffer holds as a plain dim (only inside a computed one, ``K // 8``)
cannot be renamed so: that specialization is refused with a BuildError naming the var, the parameter and what to
rename, before the compiler runs.
"""

from __future__ import annotations

from typing import Any

from tileship.errors import BuildError

#: what a clashing var's name gets appended until it is free (``factory.dynamic_name``'s suffix)
SUFFIX = "_dyn"


def rename_clashing(func: Any, spec_id: str | None = None) -> Any:
    """``func`` with every symbolic dim of its parameters' buffers that is named like one of its parameters (their
    var, buffer or data names) or a word C reserves renamed (``k`` -> ``k_dyn``); ``func`` itself when none is.
    Raises BuildError (naming ``spec_id``) for such a var that cannot be renamed. Never compiles."""
    from tilelang import tvm

    from tileship.declare.c_target import C_RESERVED
    from tileship.declare.factory import param_names

    params = param_names(func)
    holders = _shape_vars(func)
    taken = set(C_RESERVED | params) | {str(v.name) for v in holders}
    for var, candidates in holders.items():
        old = str(var.name)
        if old not in params and old not in C_RESERVED:
            continue
        new = old + SUFFIX
        while new in taken:
            new += SUFFIX
        taken.add(new)
        renamed = _specialize(func, var, tvm.tirx.Var(new, var.dtype), candidates)
        if renamed is None:
            holder = _clashing_param(func, old)
            raise BuildError(f"the kernel's T.dynamic var {old!r} has the name of {holder}, which TileLang's "
                             "generated C declares twice (a compile error), and tileship cannot rename the var: no "
                             "parameter's tensor has it as a plain dim", spec_id=spec_id,
                             hint=f'rename the var in the kernel, e.g. T.dynamic("{new}"), or the parameter (and its '
                                  "TensorArg/ScalarArg)")
        func = renamed
    return func


def _shape_vars(func: Any) -> dict[Any, list[Any]]:
    """Each symbolic var in a parameter buffer's shape or strides (not a parameter itself) -> the parameters whose
    buffer has it as a plain dim, in order."""
    from tilelang import tvm

    tir = tvm.tirx
    own = set(func.params)
    seen: list[Any] = []
    found: dict[Any, list[Any]] = {}
    for p in func.params:
        buf = func.buffer_map.get(p)
        if buf is None:
            continue
        for e in list(buf.shape) + list(buf.strides):
            tir.stmt_functor.post_order_visit(e, lambda n: seen.append(n) if isinstance(n, tir.Var) else None)
        for v in seen:
            if v not in own:
                found.setdefault(v, [])
        seen.clear()
        for d in buf.shape:
            if isinstance(d, tir.Var) and d in found and p not in found[d]:
                found[d].append(p)
    return found


def _specialize(func: Any, var: Any, new: Any, candidates: list[Any]) -> Any:
    """``func`` with ``var`` renamed ``new``, through the first candidate parameter's buffer TVM accepts; None when
    none does."""
    from tilelang import tvm

    tir = tvm.tirx
    vmap = {var: new}
    for p in candidates:
        b = func.buffer_map[p]
        buf = tir.decl_buffer([tir.stmt_functor.substitute(s, vmap) for s in b.shape], b.dtype, b.name, data=b.data,
                              strides=[tir.stmt_functor.substitute(s, vmap) for s in b.strides],
                              elem_offset=b.elem_offset, scope=b.scope(), data_alignment=b.data_alignment,
                              offset_factor=b.offset_factor, axis_separators=b.axis_separators)
        try:
            return func.specialize({p: buf})
        except Exception:  # noqa: BLE001 - TVM refuses a buffer it cannot match; the next one may do
            continue
    return None


def _clashing_param(func: Any, name: str) -> str:
    for p in func.params:
        buf = func.buffer_map.get(p)
        if name in (str(p.name), *((str(buf.name), str(buf.data.name)) if buf is not None else ())):
            kind = "tensor" if buf is not None else "scalar"
            return f"the kernel's {kind} parameter {str(buf.name) if buf is not None else str(p.name)!r}"
    return "a word C reserves"


__all__ = ["SUFFIX", "rename_clashing"]
