"""Test inputs: which shapes to exercise for a specialization and random tensors for them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .spec import Specialization


def sample_points(spec: Specialization, *, block: int = 128, limit: int | None = None) -> list[dict[str, int]]:
    """Concrete dims to call ``spec`` with. Static: the shape. Dynamic: 1 (min), a size not a
    multiple of ``block``, a middle size, and the maximum (capped at ``limit`` when given)."""
    dims = spec.dim_map()
    dyn = spec.dynamic_dim
    if dyn is None:
        return [dict(dims)]  # type: ignore[arg-type]
    lo, hi = dims[dyn]  # type: ignore[misc]
    top = hi if limit is None else max(lo, min(hi, limit))
    cands = [lo, min(top, max(lo, block + 3)), min(top, max(lo, (lo + top) // 2)), top]
    fixed: dict[str, int] = {d: x for d, x in dims.items() if d != dyn}  # type: ignore[misc]
    return [{**fixed, dyn: v} for v in dict.fromkeys(cands)]


def shapes_of(inputs: Sequence[tuple[str, Sequence[str]]], dims: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(dims[d] for d in ds) for _, ds in inputs]


def make_inputs(inputs: Sequence[tuple[str, Sequence[str]]], dims: dict[str, int], dtype: str, device: str, seed: int) -> list[Any]:
    """Fresh random normal tensors (never zeros), one per declared input."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype)
    out = []
    for shape in shapes_of(inputs, dims):
        if dt.is_floating_point:
            t = torch.randn(shape, generator=g, dtype=torch.float32)
        else:
            t = torch.randint(-8, 8, shape, generator=g, dtype=torch.int32)
        out.append(t.to(dtype=dt, device=device))
    return out
