"""Checking an ``Operator`` declaration: every field, and the shapes against the dims; the factory's signature
is checked by ``declare.factory_checks``.

``check_operator`` raises ``DeclarationError`` naming the first bad field (``field``), with a hint
where the fix is mechanical. It imports neither TileLang nor torch.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tileship.declare import sequences
from tileship.declare.dims import SAME, DimExpr, shape_at
from tileship.declare.factory_checks import check_factory
from tileship.declare.importable import check_arity
from tileship.declare.parts import DTYPES, ScalarArg, Target, TensorArg, Tolerance
from tileship.declare.sizes import INT32_MAX, check_sizes
from tileship.errors import DeclarationError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
#: the longest specialization id: a release names a directory by it (255 bytes at most on common file systems,
#: less what the build and the cache add around it)
MAX_ID = 200
_RESERVED = frozenset((*keyword.kwlist, "NoneType"))  # words torch's schema parser refuses as names

if TYPE_CHECKING:
    from tileship.declare.spec import Operator


def _check_tensors(decl: Operator, op: str) -> None:
    in_dims: set[str] = set()
    for group, args in (("inputs", decl.inputs), ("outputs", decl.outputs)):
        for a in args:
            if isinstance(a, ScalarArg) and group == "outputs":
                raise DeclarationError(
                    f"{a.name} is a ScalarArg: a kernel writes tensors, not scalars",
                    operator=op,
                    field=f"outputs.{a.name}",
                    hint=f'declare it as a tensor with a declared dim, e.g. TensorArg("{a.name}", ("M",))',
                )
            if not isinstance(a, (TensorArg, ScalarArg)):
                raise DeclarationError(
                    f"must be a TensorArg or ScalarArg, got {type(a).__name__}", operator=op, field=group
                )
            if not isinstance(a.name, str) or not _NAME.fullmatch(a.name) or a.name in _RESERVED:
                raise DeclarationError(f"{a.name!r} cannot name a kernel parameter or a torch schema argument",
                                       operator=op, field=group, hint="use an ASCII identifier, not a Python keyword")
            f = f"{group}.{a.name}"
            if isinstance(a.dims, str):
                raise DeclarationError(
                    f"dims must be a tuple of names, got the string {a.dims!r}",
                    operator=op,
                    field=f"{f}.dims",
                    hint=f'write dims=("{a.dims}",) (note the comma)',
                )
            if not isinstance(a.dims, tuple):
                raise DeclarationError(f"dims must be a tuple of dim names, got {type(a.dims).__name__}", operator=op,
                                       field=f"{f}.dims", hint=f'e.g. TensorArg("{a.name}", ("M", "N"))')
            if a.dtype != SAME and a.dtype not in DTYPES:
                raise DeclarationError(
                    f"unknown dtype {a.dtype!r} (known: same, {', '.join(DTYPES)})",
                    operator=op,
                    field=f"{f}.dtype",
                    hint='write "same" for the operator dtype, or one of the names listed',
                )
            for d in a.dims:
                try:
                    e = DimExpr.parse(d)
                except ValueError as exc:
                    raise DeclarationError(
                        str(exc),
                        operator=op,
                        field=f"{f}.dims",
                        hint='write a dim name ("K"), <dim>/<int>, <dim>//<int>, <dim>*<int> ("K/8") or a fixed size '
                        '("6")',
                    ) from None
                if e.literal:  # a size the kernel fixes (a top-k's k): no input needs to determine it
                    continue
                if group == "inputs":
                    in_dims.add(e.base)
                elif e.base not in in_dims:
                    raise DeclarationError(
                        f"output {a.name} uses dim {e.base!r} that no input determines", operator=op, field=f
                    )


def _check_name(name: object) -> None:
    """An operator name is an identifier starting with a letter, that torch's schema parser takes as an op name."""
    if not isinstance(name, str):
        raise DeclarationError(f"must be a str, got {type(name).__name__} {name!r:.60}", operator="<unnamed>",
                               field="name", hint='name the operator with an identifier, e.g. name="my_op"')
    if not _OP_NAME.fullmatch(name):
        raise DeclarationError(f"must be an identifier, got {name!r:.80}", operator="<unnamed>", field="name",
                               hint="ASCII letters, digits and _, starting with a letter")
    if name in _RESERVED:
        raise DeclarationError(f"{name!r} is a Python keyword, which torch's schema parser refuses as an op name",
                               operator=name, field="name", hint=f'rename it, e.g. name="{name.lower()}_op"')


def _check_ids(decl: Operator, op: str) -> None:
    """Each shape and range once; every specialization id short enough to name the release's directory for it."""
    from tileship.declare.specialization import Specialization

    seen: dict[tuple[tuple[str, Any], ...], str] = {}
    points: list[tuple[str, tuple[tuple[str, Any], ...]]]
    points = [(f"ranges[{i}]", (*r.fixed.items(), (r.dim, (r.min, r.max)))) for i, r in enumerate(decl.ranges)]
    points += [(f"shapes[{i}]", tuple(s.items())) for i, s in enumerate(decl.shapes)]
    for where, items in points:
        dims = dict(items)
        key: tuple[tuple[str, Any], ...] = tuple((d, dims[d]) for d in decl.dims)
        if key in seen:
            raise DeclarationError(f"repeats {seen[key]}: the build would compile one specialization twice into the "
                                   "same directory", operator=op, field=where, hint="declare each shape once")
        seen[key] = where
        longest = max((Specialization(op, dt, key, t).id for dt in decl.dtypes for t in decl.targets), key=len)
        if len(longest) > MAX_ID:
            raise DeclarationError(f"the specialization id {longest[:40]}... is {len(longest)} characters, over "
                                   f"{MAX_ID}: a release names a directory by it", operator=op, field=where,
                                   hint="shorten the operator name or its dim names")


def _check_exact(decl: Operator, op: str, sizes: Mapping[str, int], where: str) -> None:
    for a in decl.inputs + decl.outputs:
        try:
            shape_at([d for d in a.dims if DimExpr.parse(d).base in sizes], sizes)
        except ValueError as exc:
            base = str(exc).split("=", 1)[0]
            raise DeclarationError(
                f"{exc} of {a.name}: that shape is not one the declaration covers",
                operator=op,
                field=f"{where}.{base}",
                hint=f"use a {base} that divides",
            ) from None


def check_operator(decl: Operator) -> None:
    """Raise DeclarationError naming the first bad field of ``decl``; return None when valid."""
    _check_name(decl.name)
    op = decl.name
    sequences.check(decl, op)  # first: everything below iterates and concatenates them
    from tileship.declare.factory import resolve

    resolve(decl.factory, operator=op)  # raises for anything that is not a kernel factory
    if decl.reference is None or not callable(decl.reference):
        raise DeclarationError(
            "a PyTorch reference is required",
            operator=op,
            field="reference",
            hint="pass reference=fn computing the same result",
        )
    if not decl.inputs:
        raise DeclarationError("at least one input tensor is required", operator=op, field="inputs")
    if not any(isinstance(a, TensorArg) for a in decl.inputs):
        raise DeclarationError("at least one input must be a tensor (it names the device)", operator=op, field="inputs")
    names = [a.name for a in decl.inputs + decl.outputs]
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        k = len(decl.inputs)
        where = [f"inputs[{i}]" if i < k else f"outputs[{i - k}]" for i, n in enumerate(names) if n == dup]
        raise DeclarationError(f"{dup!r} names {' and '.join(where)}: each input and output needs its own name (calls "
                               f"and the server pass them by name); names: {names}", operator=op,
                               field="inputs", hint="rename one of them (and the kernel's parameter)")
    _check_tensors(decl, op)
    if not decl.dtypes:
        raise DeclarationError("no dtypes declared", operator=op, field="dtypes")
    for dt in decl.dtypes:
        if dt not in DTYPES:
            raise DeclarationError(f"unknown dtype {dt!r} (known: {', '.join(DTYPES)})", operator=op, field="dtypes")
    if len(decl.dtypes) > 1 and not any(isinstance(a, TensorArg) and a.dtype == SAME for a in decl.inputs):
        raise DeclarationError(f"{', '.join(decl.dtypes)}: no input tensor has the operator dtype, so a call cannot "
                               "say which one it wants", operator=op, field="dtypes",
                               hint='declare one dtype per operator, or give an input tensor dtype="same"')
    if not decl.targets:
        raise DeclarationError("no targets declared", operator=op, field="targets")
    for t in decl.targets:
        try:
            Target(t)
        except DeclarationError as exc:
            raise DeclarationError(exc.message, operator=op, field="targets", hint=exc.hint) from None
    if not decl.shapes and not decl.ranges:
        raise DeclarationError(
            "the shape set is empty: declare shapes=[...] and/or ranges=[...]", operator=op, field="shapes"
        )
    dims = set(decl.dims)
    for i, shape in enumerate(decl.shapes):
        for d, v in shape.items():
            if d not in dims:
                raise DeclarationError(
                    f"unknown dim {d!r} (dims: {', '.join(decl.dims)})", operator=op, field=f"shapes[{i}].{d}"
                )
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise DeclarationError(f"must be a positive int, got {v!r}", operator=op, field=f"shapes[{i}].{d}")
        missing = dims - set(shape)
        if missing:
            raise DeclarationError(f"missing dims {sorted(missing)}", operator=op, field=f"shapes[{i}]")
        _check_exact(decl, op, shape, f"shapes[{i}]")
        check_sizes(decl, op, shape, f"shapes[{i}]")
    for i, r in enumerate(decl.ranges):
        f = f"ranges[{i}]"
        if r.dim not in dims:
            raise DeclarationError(
                f"unknown dim {r.dim!r} (dims: {', '.join(decl.dims)})", operator=op, field=f"{f}.dim"
            )
        for bound in ("min", "max"):
            v = getattr(r, bound)
            if not isinstance(v, int) or isinstance(v, bool) or v > INT32_MAX:
                raise DeclarationError(f"{bound} must be an int of at most {INT32_MAX} (2**31 - 1), got {v!r}",
                                       operator=op, field=f"{f}.{bound}",
                                       hint="a T.dynamic dim is an int32 in the generated code")
        if r.min < 1:
            raise DeclarationError(f"min must be >= 1, got {r.min}", operator=op, field=f"{f}.min")
        if r.min > r.max:
            raise DeclarationError(f"min {r.min} > max {r.max}", operator=op, field=f"{f}.min")
        for d in r.fixed:
            if d not in dims:
                raise DeclarationError(f"unknown dim {d!r}", operator=op, field=f"{f}.fixed.{d}")
            if d == r.dim:
                raise DeclarationError(f"fixed gives {d} = {r.fixed[d]!r}, the range's own dim ({r.min}..{r.max})",
                                       operator=op, field=f"{f}.fixed.{d}",
                                       hint=f"leave {d} out of fixed, or declare {d}={r.fixed[d]!r} as a shape")
            v = r.fixed[d]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:  # as a static shape's dims are
                raise DeclarationError(f"must be a positive int, got {v!r:.60}", operator=op, field=f"{f}.fixed.{d}")
        missing = dims - set(r.fixed) - {r.dim}
        if missing:
            raise DeclarationError(f"fixed is missing dims {sorted(missing)}", operator=op, field=f"{f}.fixed")
        _check_exact(decl, op, r.fixed, f"{f}.fixed")
        check_sizes(decl, op, {**r.fixed, r.dim: r.max}, f)  # the range at its max
        for a in decl.inputs + decl.outputs:
            for d in a.dims:
                e = DimExpr.parse(d)
                if e.base == r.dim and e.op in ("/", "//") and r.min != r.max:
                    raise DeclarationError(
                        f"{r.dim} is T.dynamic in [{r.min}, {r.max}] but {a.name} declares {d}: "
                        f"not every {r.dim} there divides by {e.k}",
                        operator=op,
                        field=f"{f}.dim",
                        hint=f"declare static shapes=[...] for {r.dim}, "
                        "or make the dynamic dim one that is not divided",
                    )
    _check_ids(decl, op)
    _check_mutates(decl, op)
    compared = [a.name for a in decl.outputs] + list(decl.mutates)
    for key, tol in decl.tolerances.items():
        if key not in DTYPES and key not in compared:
            raise DeclarationError(
                f"{key!r} is neither a dtype nor an output or mutated input name (those: {', '.join(compared)})",
                operator=op,
                field=f"tolerances.{key}",
                hint='key by operator dtype ("float16") or by output name ("mean")',
            )
        if not isinstance(tol, Tolerance):
            raise DeclarationError(
                f"must be a Tolerance(atol, rtol), got {type(tol).__name__}", operator=op, field=f"tolerances.{key}"
            )
        for part in ("atol", "rtol"):
            v = getattr(tol, part)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise DeclarationError(f"{part} must be a finite number >= 0, got {v!r}", operator=op,
                                       field=f"tolerances.{key}.{part}",
                                       hint="a negative or NaN tolerance fails every kernel, however exact")
    names = [a.name for a in decl.inputs]
    check_arity(decl.reference, names, op, "reference",
                 f"the reference takes the inputs in declaration order, like a call: def ref({', '.join(names)}): ...")
    for name, value, hint, args in (
        ("sample", decl.sample, "pass sample=fn(dims, dtype, device) returning one tensor per input",
         ["dims", "dtype", "device"]),
        ("cost", decl.cost, "pass cost=fn(dims, dtype) returning (flops, bytes) of one call", ["dims", "dtype"]),
        ("applies", decl.applies, "pass applies=fn(config, dims) returning whether a candidate builds a shape",
         ["config", "dims"]),
    ):
        if value is not None and not callable(value):
            raise DeclarationError(f"{name} is not callable", operator=op, field=name, hint=hint)
        if value is not None:
            check_arity(value, args, op, name, hint)
    check_factory(decl, op)


def _check_mutates(decl: Operator, op: str) -> None:
    """``mutates`` names tensor inputs, each once; an output or a scalar cannot be updated in place."""
    if isinstance(decl.mutates, str):
        raise DeclarationError(f"must be a tuple of input names, got the string {decl.mutates!r}", operator=op,
                               field="mutates", hint=f'write mutates=("{decl.mutates}",) (note the comma)')
    inputs = {a.name: a for a in decl.inputs}
    outputs = {a.name for a in decl.outputs}
    for name in decl.mutates:
        f = f"mutates.{name}"
        if not isinstance(name, str):
            raise DeclarationError(f"must be an input name, got {type(name).__name__}", operator=op, field="mutates")
        if name in outputs:
            raise DeclarationError(f"{name} is an output: the kernel writes outputs anyway", operator=op, field=f,
                                   hint="name the inputs the kernel updates in place; leave outputs in outputs=")
        if name not in inputs:
            raise DeclarationError(f"{name!r} is not an input (inputs: {', '.join(inputs)})", operator=op, field=f,
                                   hint="list the names of the input tensors the kernel updates in place")
        if isinstance(inputs[name], ScalarArg):
            raise DeclarationError(f"{name} is a ScalarArg: a scalar is passed by value and cannot be updated in "
                                   "place", operator=op, field=f, hint="declare it as a TensorArg")
    if len(set(decl.mutates)) != len(decl.mutates):
        raise DeclarationError(f"names an input twice: {list(decl.mutates)}", operator=op, field="mutates")
