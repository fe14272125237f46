"""The traced kernel against its declaration, at build time: a kernel whose parameters do not match
what its operator declares is refused before it is compiled, with an error naming the argument.

Per parameter, in the kernel's order (the declared inputs, then the declared outputs at the
output positions):

- a ``TensorArg`` is a tensor parameter and a ``ScalarArg`` a scalar one of the declared dtype (a float32
  one over an int32 parameter would let a call pass 2.5, which the launch cannot convert);
- the same number of dims, and every dim the kernel fixes (a constant) equal to the declared size
  at this specialization (a dim of the ``T.dynamic`` range, or one the kernel computes, is not
  compared);
- the same dtype;
- parameter names that are the declared names in another order are refused too.

Without this, a kernel declared with ``A`` as ``(N,)`` but written as ``(N, 4)`` reads past the
caller's tensor on the launch path, and inputs or outputs declared in another order than the
kernel takes them are served swapped. Verification finds both later, but a release must not carry
them, and a CPU release may serve before anyone verifies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tileship.declare.dims import DimExpr, resolve_dtype
from tileship.declare.parts import ScalarArg
from tileship.errors import BuildError

_FIX = "make the declaration match the kernel's parameters (or the kernel match the declaration)"


def check(op: Any, spec: Any, func: Any, positions: Sequence[int]) -> None:
    """Raise BuildError for the first parameter of the traced ``func`` that disagrees with ``op``'s
    declaration at ``spec``; ``positions``: the kernel's output parameters."""
    params = list(func.params)
    bmap = func.buffer_map
    outs = set(positions)
    kin = [p for i, p in enumerate(params) if i not in outs]
    kout = [params[i] for i in positions]
    din = list(op.inputs)
    dout = [] if op.infers_outputs else list(op.outputs)
    if len(kin) != len(din):
        raise BuildError(f"the kernel takes {len(kin)} inputs ({', '.join(_name(p, bmap) for p in kin)}) but "
                         f"{len(din)} are declared ({', '.join(a.name for a in din)})", spec_id=spec.id, hint=_FIX)
    if dout and len(kout) != len(dout):
        raise BuildError(f"the kernel has {len(kout)} outputs but {len(dout)} are declared", spec_id=spec.id, hint=_FIX)
    names = [_name(p, bmap) for p in kin + (kout if dout else [])]
    want = [a.name for a in din + dout]
    if names != want and sorted(names) == sorted(want):
        raise BuildError(f"the declaration lists {', '.join(want)} but the kernel takes {', '.join(names)}: the same "
                         "names in another order would be served swapped", spec_id=spec.id,
                         hint="declare inputs and outputs in the order of the kernel's parameters")
    sizes = {d: v for d, v in spec.dims if isinstance(v, int)}
    for decl, p in list(zip(din, kin, strict=True)) + list(zip(dout, kout, strict=False)):
        _check_one(decl, p, bmap.get(p), sizes, spec)


def _check_one(decl: Any, param: Any, buf: Any, sizes: dict[str, int], spec: Any) -> None:
    from tilelang import tvm

    what = f"{decl.name} (the kernel's parameter {buf.name if buf is not None else param.name})"
    if isinstance(decl, ScalarArg):
        if buf is not None:
            raise BuildError(f"{what} is declared a ScalarArg but the kernel takes a tensor", spec_id=spec.id,
                             hint=_FIX)
        dtype = resolve_dtype(decl.dtype, spec.dtype)
        if str(param.dtype) != dtype:  # the declared dtype decides which Python numbers a call may pass
            raise BuildError(f"{what}: declared a {dtype} ScalarArg but the kernel takes a {param.dtype}",
                             spec_id=spec.id, hint=f'declare ScalarArg("{decl.name}", dtype="{param.dtype}")')
        return
    if buf is None:
        raise BuildError(f"{what} is declared a tensor but the kernel takes a scalar", spec_id=spec.id, hint=_FIX)
    shape = list(buf.shape)
    if len(shape) != len(decl.dims):
        raise BuildError(f"{what}: declared with {len(decl.dims)} dims {tuple(decl.dims)} but the kernel's has "
                         f"{len(shape)} ({', '.join(str(s) for s in shape)})", spec_id=spec.id, hint=_FIX)
    for i, (d, s) in enumerate(zip(decl.dims, shape, strict=True)):
        e = DimExpr.parse(d)
        want = e.size(sizes)
        if e.literal and not isinstance(s, tvm.tirx.IntImm):
            raise BuildError(f"{what}: dim {i} is fixed at {e.k} in the declaration but the kernel's is {s}",
                             spec_id=spec.id, hint=_FIX)
        if want is None or not isinstance(s, tvm.tirx.IntImm):
            continue
        if int(s) != want:
            size = f"{d} = {want}" if not e.literal else f"fixed at {want}"
            raise BuildError(f"{what}: dim {i} is {size} in the declaration but {int(s)} in "
                             "the kernel", spec_id=spec.id, hint=_FIX)
    dtype = resolve_dtype(decl.dtype, spec.dtype)
    if str(buf.dtype) != dtype:
        raise BuildError(f"{what}: declared {dtype} but the kernel's is {buf.dtype}", spec_id=spec.id, hint=_FIX)


def _name(param: Any, bmap: Any) -> str:
    buf = bmap.get(param) if hasattr(bmap, "get") else None
    return str(buf.name) if buf is not None else str(param.name)


__all__ = ["check"]
