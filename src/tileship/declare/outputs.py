"""Outputs as the kernel declares them: for a factory whose kernel allocates its outputs with
``T.empty`` (TileLang's ``tilelang_out_idx``) or names them with ``@tilelang.jit(out_idx=...)`` (the
declared inputs are then its other parameters), ``outputs=`` may be omitted and is read here from
one trace of the factory (no compile): each output's name, dims (in terms of the declared
base dims, derived ones such as ``K/8`` included) and dtype (``"same"`` when it is the operator
dtype). Imports TileLang (the operator module already has)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tileship.declare.spec import Operator, Specialization, TensorArg, expand
from tileship.errors import DeclarationError, TileshipError


def infer_outputs(op: Operator) -> Operator:
    """``op`` with ``outputs`` filled from its traced kernel, at the first declared shape (static ones first) that
    the factory takes. Raises DeclarationError (field ``outputs``) when it takes none, when the kernel has no
    ``T.empty`` outputs and its decorator no ``out_idx`` that leaves the declared inputs, or when a size cannot be
    told apart."""
    from tileship.declare.factory import decorator_out_idx, kernel_out_idx, resolve, trace

    specs = expand(op)
    # static shapes first; a shape the factory refuses (it asserts on a size) fails only its own build
    order = [s for s in specs if s.dynamic_dim is None] + [s for s in specs if s.dynamic_dim is not None]
    failed: list[tuple[Specialization, Exception]] = []
    for spec in order:
        try:
            func = trace(op, spec)
            break
        except TileshipError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's factory failed here: try the next shape
            failed.append((spec, exc))
    else:  # no shape traces: say so as a declaration problem
        at, first = failed[0]
        raise DeclarationError(f"tracing the factory at {at.shape_key} to read its T.empty outputs failed: "
                               f"{type(first).__name__}: {first}" + (f" (and at every other of the {len(order)} "
                                                                     "shapes)" if len(order) > 1 else ""),
                               operator=op.name, field="outputs",
                               hint="declare outputs=(TensorArg(...), ...) explicitly") from first
    idx = kernel_out_idx(func)
    if not idx:  # no T.empty: the outputs a lazy kernel's @tilelang.jit(out_idx=...) names, as TileLang calls it
        deco = decorator_out_idx(resolve(op.factory, operator=op.name), func)
        if deco and len(func.params) - len(deco) == len(op.inputs):
            return dataclasses.replace(op, outputs=tuple(_output(op, spec, _buffer(op, func, i)) for i in deco))
        why = (f"its @tilelang.jit(out_idx=...) makes parameters {deco} of {len(func.params)} its outputs, which "
               f"leaves {len(func.params) - len(deco)} inputs, not the {len(op.inputs)} declared" if deco else
               "the kernel allocates no outputs with T.empty nor names them with @tilelang.jit(out_idx=...)")
        raise DeclarationError(f"is omitted but {why}", operator=op.name, field="outputs",
                               hint="declare outputs=(TensorArg(name, dims), ...) for the kernel's output parameters")
    if idx != list(range(len(op.inputs), len(func.params))):
        raise DeclarationError(f"the kernel's T.empty outputs are parameters {idx} of {len(func.params)}, not the "
                               f"{len(func.params) - len(op.inputs)} "
                               f"after the {len(op.inputs)} declared inputs", operator=op.name, field="inputs",
                               hint="declare exactly the kernel's tensor parameters as inputs, in order")
    outs = tuple(_output(op, spec, func.buffer_map[func.params[i]]) for i in idx)
    return dataclasses.replace(op, outputs=outs)


def _buffer(op: Operator, func: Any, i: int) -> Any:
    """The buffer of the kernel's parameter ``i``; DeclarationError when it takes a scalar there."""
    buf = func.buffer_map.get(func.params[i])
    if buf is None:
        raise DeclarationError(f"the kernel's output parameter {i} ({func.params[i].name}) is a scalar, not a tensor",
                               operator=op.name, field="outputs",
                               hint="point @tilelang.jit(out_idx=...) at the kernel's output tensors")
    return buf


def _output(op: Operator, spec: Specialization, buf: Any) -> TensorArg:
    dims = spec.dim_map()
    name = str(buf.name).removesuffix("_handle")
    dims_out = tuple(_dim(op, dims, s, name, k) for k, s in enumerate(buf.shape))
    dtype = str(buf.dtype)
    return TensorArg(name, dims_out, "same" if dtype == spec.dtype else dtype)


def _dim(op: Operator, dims: dict[str, Any], size: Any, out: str, k: int) -> str:
    from tilelang import tvm

    from tileship.declare.factory import is_dynamic_name

    if isinstance(size, tvm.tirx.Var):  # the T.dynamic dim, or one the kernel makes dynamic itself (T.dynamic("n"))
        want = str(size.name)
        for d, v in dims.items():
            if isinstance(v, tuple) and is_dynamic_name(want, d):
                return d
        named = [d for d in dims if want == d or is_dynamic_name(want.lower(), d)]  # k, k_dyn: var_names
        if len(named) == 1:
            return named[0]
    value = getattr(size, "value", None)
    if isinstance(value, int):
        static = {d: v for d, v in dims.items() if not isinstance(v, tuple)}
        hits = [d for d, v in static.items() if v == value]
        if len(hits) == 1:
            return hits[0]
        for factor in (2, 4, 8, 16, 32, 64, 128, 256):
            hits += [f"{d}/{factor}" for d, v in static.items() if v % factor == 0 and v // factor == value]
            hits += [f"{d}*{factor}" for d, v in static.items() if v * factor == value]
        if len(hits) == 1:
            return hits[0]
        if not hits:  # a size the kernel fixes (a top-k's k); the build holds every other shape to it
            return str(value)
        why = f"could be any of {', '.join(hits)}"
    else:
        why = f"is the expression {size}"
    raise DeclarationError(f"the size of dim {k} of the kernel's T.empty output {out} ({size}) {why}", operator=op.name,
                           field="outputs", hint=f"declare outputs=(TensorArg(\"{out}\", (...)),) with its dims")
