"""A kernel's calling convention, read from the bundle's ``signature.json`` without TVM or TileLang.

``signature.json`` is the kernel's TIR ``PrimFunc`` serialized by TVM-FFI's JSON graph
(``tvm.ir.save_json`` at build time): ``nodes`` is a list of ``{"type", "data"}`` whose
references are indices into that list, ``root_index`` the function. The loader needs only
what a call needs of it (the parameters in order, each a buffer with dtype, shape and
strides or a by-value scalar; the symbolic dims and where each is read from; the
callee-allocated-outputs attribute), so it walks the graph in plain Python: importing TVM's
Python package, or TileLang's, would bring their compilers into the serving process.

``read(text, out_idx)`` raises ``ValueError`` on a graph it cannot read; the caller names the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the PrimFunc attribute TileLang stamps at lowering when the tvm-ffi entry allocates its
#: outputs itself (``tilelang.jit.abi.CALLEE_ALLOCATED_OUTPUTS_ATTR`` in 0.1.15)
CALLEE_ALLOCATED_OUTPUTS = "tilelang_callee_allocated_outputs"


@dataclass(frozen=True)
class Sym:
    """A symbolic dim (a ``tirx.Var``); ``node`` is its identity in the graph."""

    node: int
    name: str
    dtype: str

    def __str__(self) -> str:
        return self.name


#: TIR's integer arithmetic, as a kernel's shape may be written (``(M, N * 2)``, ``(N, K // 8)``)
_ARITH: dict[str, Callable[[int, int], int]] = {
    "tirx.Add": lambda a, b: a + b, "tirx.Sub": lambda a, b: a - b, "tirx.Mul": lambda a, b: a * b,
    "tirx.FloorDiv": lambda a, b: a // b, "tirx.FloorMod": lambda a, b: a % b,
    "tirx.Div": lambda a, b: int(a / b), "tirx.Mod": lambda a, b: a - b * int(a / b),
    "tirx.Min": min, "tirx.Max": max}


@dataclass(frozen=True)
class Expr:
    """A dim computed from symbolic dims (an output ``(M, N * 2)``): ``op`` a TIR node type of ``_ARITH``,
    ``"tirx.Cast"`` (one operand), or one this reader does not know (``evaluate`` raises ValueError)."""

    op: str
    args: tuple[int | Sym | Expr, ...]

    def evaluate(self, values: Any) -> int:
        """Its value given ``values(sym) -> int`` for each symbolic dim; ValueError for an unknown ``op``."""
        vals = [dim_value(a, values) for a in self.args]
        if self.op == "tirx.Cast" and len(vals) == 1:
            return vals[0]
        if self.op not in _ARITH or len(vals) != 2:
            raise ValueError(f"a shape computed by {self.op} with {len(vals)} operands")
        return int(_ARITH[self.op](*vals))

    def __str__(self) -> str:
        return f"{self.op.removeprefix('tirx.')}({', '.join(map(str, self.args))})"


def dim_value(d: Any, values: Any) -> int:
    """The size of a shape entry (an int, a ``Sym`` read by ``values(sym) -> int``, an ``Expr``).
    ValueError for anything else: a node of the kernel's graph this reader does not know."""
    if isinstance(d, bool) or not isinstance(d, (int, Sym, Expr)):
        raise ValueError(f"a shape entry tileship cannot evaluate: {d!r:.200}")
    return d if isinstance(d, int) else int(values(d)) if isinstance(d, Sym) else d.evaluate(values)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: a buffer (``shape`` not None) or a by-value scalar."""

    name: str
    dtype: str
    shape: tuple[int | Sym | Expr, ...] | None
    strides: tuple[int | Sym | Expr, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return self.shape is None

    def torch_dtype(self) -> Any:
        return torch_dtype(self.dtype)


@dataclass(frozen=True)
class Signature:
    """What calling the compiled entry needs: ``params`` in order, ``result_idx`` (non-negative),
    ``dynamic``: per symbolic dim in the order the ``call`` ABI takes them, (kind, param, axis,
    scale) with kind 0 a shape dim and 1 a stride (TileLang's ``dynamic_symbolic_map``)."""

    params: tuple[Param, ...]
    result_idx: tuple[int, ...]
    dynamic: tuple[tuple[Sym, tuple[int, int, int, int]], ...]
    callee_allocated_outputs: bool

    @property
    def dynamic_symbolic_map(self) -> dict[Sym, tuple[int, int, int, int]]:
        return dict(self.dynamic)


_TORCH_NAMES = {"bool": "bool", "float8_e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
                "float8_e5m2": "float8_e5m2"}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a TVM dtype string; ``ValueError`` for one torch has no tensor type for."""
    import torch

    got = getattr(torch, _TORCH_NAMES.get(name, name), None)
    if not isinstance(got, torch.dtype):
        raise ValueError(f"no torch dtype for the kernel dtype {name!r}")
    return got


class _Graph:
    def __init__(self, text: str) -> None:
        doc = json.loads(text)
        self.nodes: list[dict[str, Any]] = doc["nodes"]
        self.root: int = doc["root_index"]

    def node(self, i: int) -> dict[str, Any]:
        return self.nodes[i]

    def value(self, i: int) -> Any:
        """A leaf or container as a Python value; a Var as ``Sym``; anything else its raw data."""
        n = self.nodes[i]
        kind = n["type"]
        data: Any = n.get("data")
        if kind == "None":
            return None
        if kind in ("ffi.String", "ffi.SmallStr", "int", "float", "bool"):
            return data
        if kind in ("ir.IntImm", "ir.FloatImm"):
            return data["value"]
        if kind in ("tirx.Var", "tirx.SizeVar"):
            return Sym(i, self.value(data["name"]), data["dtype"])
        if kind in _ARITH:
            return Expr(kind, (self.value(data["a"]), self.value(data["b"])))
        if kind == "tirx.Cast":
            return Expr(kind, (self.value(data["value"]),))
        if kind in ("ffi.Array", "ffi.Shape"):
            return [self.value(j) for j in data]
        if kind == "ffi.Map":
            return {self.value(k) if self.nodes[k]["type"] in ("ffi.String", "ffi.SmallStr") else k: self.value(v)
                    for k, v in zip(data[::2], data[1::2], strict=True)}
        return data


def read(text: str, out_idx: list[int] | None) -> Signature:
    """The signature of the PrimFunc serialized in ``text``; ``out_idx`` from ``artifact.json``."""
    g = _Graph(text)
    root = g.node(g.root)
    if root["type"] != "tirx.PrimFunc":
        raise ValueError(f"the root node is a {root['type']}, not a tirx.PrimFunc")
    fn = root["data"]
    param_nodes: list[int] = g.node(fn["params"])["data"]
    bmap = g.node(fn["buffer_map"])["data"]
    buffers = dict(zip(bmap[::2], bmap[1::2], strict=True))  # param var node -> buffer node
    attrs: dict[str, Any] = {}
    if fn.get("attrs") is not None:
        dict_node = g.node(fn["attrs"])
        if dict_node["type"] == "ir.DictAttrs":
            attrs = g.value(dict_node["data"]["__dict__"]) or {}
    params = []
    for p in param_nodes:
        var = g.node(p)["data"]
        if p in buffers:
            buf = g.node(buffers[p])["data"]
            params.append(Param(g.value(buf["name"]), buf["dtype"], tuple(g.value(buf["shape"])),
                                tuple(g.value(buf["strides"]) or ())))
        else:
            params.append(Param(g.value(var["name"]), var["dtype"], None))
    n = len(params)
    result_idx = tuple(sorted(i % n for i in (out_idx or [])))
    scalar_nodes = {p for p in param_nodes if p not in buffers}
    order = [i for i in range(n) if i not in result_idx] + [i for i in range(n) if i in result_idx]
    dynamic: dict[Sym, tuple[int, int, int, int]] = {}
    for i in order:  # shapes first, inputs before outputs: the order of TileLang's ``call`` ABI
        for j, d in enumerate(params[i].shape or ()):
            if isinstance(d, Sym) and d not in dynamic and d.node not in scalar_nodes:
                dynamic[d] = (0, i, j, 1)
    for i in order:
        bits = _bits(params[i].dtype)
        for j, s in enumerate(params[i].strides):
            if isinstance(s, Sym) and s not in dynamic and s.node not in scalar_nodes:
                dynamic[s] = (1, i, j, 8 // bits if bits < 8 else 1)
    callee = bool(result_idx) and int(attrs.get(CALLEE_ALLOCATED_OUTPUTS, 0) or 0) != 0
    return Signature(tuple(params), result_idx, tuple(dynamic.items()), callee)


def _bits(dtype: str) -> int:
    digits = "".join(c for c in dtype.split("x")[0] if c.isdigit())
    if dtype in ("bool",):
        return 8
    if dtype.startswith("float4"):
        return 4
    if dtype.startswith(("float8", "float6")):
        return 8
    return int(digits) if digits else 8


__all__ = ["CALLEE_ALLOCATED_OUTPUTS", "Expr", "Param", "dim_value", "Signature", "Sym", "read", "torch_dtype"]
