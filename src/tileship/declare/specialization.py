"""Specialization: one compiled unit (operator x dtype x shape x target), and reading described tensors.

A specialization is what the build compiles and the runtime dispatches to; it is a plain
value (JSON round-trip, stable id). The helpers read a described operator (describe)
without the declaration: each tensor's dtype and each output's tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tileship.declare.dims import SAME
from tileship.declare.parts import DEFAULT_TOLERANCES, Tolerance


@dataclass(frozen=True)
class Specialization:
    """One thing the build compiles: operator x dtype x shape (or dynamic range) x target.

    ``dims`` maps each dim to an int, or to ``(min, max)`` for the one ``T.dynamic`` dim.
    ``candidate`` names one of the operator's candidate configs (``tileship.declare.candidates``)
    and ``config`` holds it (laid over ``Operator.config`` when building); both are empty for an
    operator without candidates. Candidates of one shape share a ``group_id``.
    """

    op: str
    dtype: str
    dims: tuple[tuple[str, int | tuple[int, int]], ...]
    target: str
    candidate: str = ""
    config: tuple[tuple[str, int | float | str | bool], ...] = ()

    @property
    def dynamic_dim(self) -> str | None:
        for d, v in self.dims:
            if isinstance(v, tuple):
                return d
        return None

    @property
    def shape_key(self) -> str:
        parts = []
        for d, v in self.dims:
            parts.append(f"{d}{v[0]}-{v[1]}" if isinstance(v, tuple) else f"{d}{v}")
        return "_".join(parts)

    @property
    def group_id(self) -> str:
        """The id without the candidate: what every candidate of this shape shares."""
        return f"{self.op}.{self.dtype}.{self.shape_key}.{self.target}"

    @property
    def id(self) -> str:
        return f"{self.group_id}.{self.candidate}" if self.candidate else self.group_id

    def group(self) -> Specialization:
        """The same specialization without its candidate."""
        return Specialization(self.op, self.dtype, self.dims, self.target)

    def dim_map(self) -> dict[str, int | tuple[int, int]]:
        return dict(self.dims)

    def to_json(self) -> dict[str, Any]:
        """JSON form; dims are an ordered list of [name, size | [min, max]] (files sort keys,
        and the dims' order is part of the id)."""
        out: dict[str, Any] = {"op": self.op, "dtype": self.dtype, "target": self.target,
                               "dims": [[d, list(v) if isinstance(v, tuple) else v] for d, v in self.dims]}
        if self.candidate:
            out["candidate"] = self.candidate
            out["config"] = [[k, v] for k, v in self.config]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Specialization:
        raw = data["dims"]
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        dims = tuple((d, tuple(v) if isinstance(v, list) else int(v)) for d, v in pairs)
        config = tuple((str(k), v) for k, v in data.get("config") or ())
        return cls(op=data["op"], dtype=data["dtype"], dims=dims, target=data["target"],  # type: ignore[arg-type]
                   candidate=str(data.get("candidate") or ""), config=config)


def tensor_dtypes(desc: Mapping[str, Any], which: str, op_dtype: str) -> list[str]:
    """The dtype name of each input (``which="inputs"``) or output of a described operator in a
    specialization of ``op_dtype`` (a release without ``tensor_dtypes`` has one dtype throughout)."""
    exprs = desc.get("tensor_dtypes") or {}
    return [op_dtype if exprs.get(n, SAME) == SAME else exprs[n] for n, *_ in desc[which]]


def call_dtypes(desc: Mapping[str, Any]) -> dict[str, str]:
    """Each tensor's dtype expression (name -> "same" or a literal) as a call sees it. A call's "same" is the dtype
    of its first "same" input tensor; where no input tensor is "same", that is nothing to go by, and the operator's
    one dtype (``checks``: it may declare only one) stands for "same" instead."""
    exprs = {str(n): (desc.get("tensor_dtypes") or {}).get(n, SAME) for n, *_ in [*desc["inputs"], *desc["outputs"]]}
    scalars = set(desc.get("scalars") or ())
    dtypes = list(desc.get("dtypes") or ())
    if len(dtypes) == 1 and not any(exprs[n] == SAME for n, *_ in desc["inputs"] if n not in scalars):
        return {n: dtypes[0] if e == SAME else e for n, e in exprs.items()}
    return exprs


def tensor_tolerance(desc: Mapping[str, Any], output: str, op_dtype: str) -> Tolerance:
    """The described tolerance of ``output``: its per-output override, else the operator dtype's."""
    t = (desc.get("output_tolerances") or {}).get(output) or (desc.get("tolerances") or {}).get(op_dtype)
    if t is None:
        return Tolerance(*DEFAULT_TOLERANCES[op_dtype])
    return Tolerance(float(t["atol"]), float(t["rtol"]))
