"""Inputs derived from a declaration: which shapes to exercise a specialization at, and random
tensors for them. The one home of shape sampling and input generation (demo, verify, serve, drill)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tileship.declare.dims import SAME, resolve_dtype, shape_at
from tileship.declare.spec import Specialization


def sample_points(spec: Specialization, *, block: int = 128, grid: int = 0,
                  limit: int | None = None) -> list[dict[str, int]]:
    """Concrete dims to call ``spec`` with, in declaration order. Static: the shape. Dynamic: 1 (min),
    a size not a multiple of ``block``, a middle size and the maximum (capped at ``limit`` when
    given), plus, when ``grid >= 2``, every power of ``grid`` in between."""
    dims = spec.dim_map()
    dyn = spec.dynamic_dim
    if dyn is None:
        return [{d: _static(dims[d]) for d, _ in spec.dims}]
    lo, hi = dims[dyn]  # type: ignore[misc]
    top = hi if limit is None else max(lo, min(hi, limit))
    sizes = [lo, min(top, max(lo, block + 3)), min(top, max(lo, (lo + top) // 2)), top]
    if grid >= 2:
        v = 1
        while v <= top:
            if v >= lo:
                sizes.append(v)
            v *= grid
        sizes = sorted(set(sizes))
    return [{d: (s if d == dyn else _static(dims[d])) for d, _ in spec.dims}
            for s in dict.fromkeys(sizes)]


def _static(size: int | tuple[int, int]) -> int:
    """A static dim's size; a specialization has one dynamic dim (a (min, max) range) at most."""
    if isinstance(size, tuple):
        raise ValueError(f"a second dynamic dim {size}: a specialization has one dynamic dim at most")
    return int(size)


def verification_points(spec: Specialization, *, block: int = 128, grid: int = 4,
                        limit: int | None = None) -> list[dict[str, int]]:
    """``sample_points`` with a geometric grid (default 4) between the edges, sorted: what verify measures."""
    dyn = spec.dynamic_dim
    points = sample_points(spec, block=block, grid=grid, limit=limit)
    return sorted(points, key=lambda p: p[dyn]) if dyn else points


def shapes_of(inputs: Sequence[tuple[str, Sequence[str]]], dims: Mapping[str, int]) -> list[tuple[int, ...]]:
    """The concrete shape of each declared tensor at base ``dims`` (derived dims computed)."""
    return [shape_at(ds, dims) for _, ds in inputs]


def make_inputs(inputs: Sequence[tuple[str, Sequence[str]]], dims: Mapping[str, int], dtype: str, device: str,
                seed: int, *, dtypes: Sequence[str] | None = None, sample: Callable[..., Any] | None = None,
                scalars: Sequence[int] = ()) -> list[Any]:
    """One input per declared tensor at base ``dims``, reproducible per (device, seed).

    ``dtypes``: each input's dtype expression ("same" or a literal; default all "same").
    ``sample``: the operator's ``sample(dims, dtype, device)`` hook (``dtype`` the dtype's name, a str), called under
    a forked RNG seeded with ``seed``; its tensors are checked against the declared shapes and dtypes, its float
    scalars rounded to their declared dtype (``as_declared``). What it raises is raised (a TypeError saying that
    ``dtype`` is a str when its message holds the name: ``x.to(dtype)`` took it for a device).
    ``scalars``: positions of ``ScalarArg`` inputs: Python numbers (floats in [0.5, 1.5) as their dtype holds them, ints
    in [1, 8], bools True) unless the hook gives them.
    Without it, drawn on ``device`` from a generator seeded with ``seed``: floats standard normal
    (never zeros), ints in [-8, 8), uint8 and bool random 0/1.
    """
    import torch

    exprs = list(dtypes) if dtypes is not None else [SAME] * len(inputs)
    names = [resolve_dtype(e, dtype) for e in exprs]
    shapes = shapes_of(inputs, dims)
    if sample is not None:
        devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            try:
                got = sample(dict(dims), dtype, device)
            except Exception as exc:
                if repr(dtype) not in str(exc):
                    raise
                # ``x.to(dtype)`` reads the name as a device: "Invalid device string: 'float32'", which says nothing
                # of why; the hook is told what it was given
                raise TypeError(f"{getattr(sample, '__name__', 'sample')}(dims, dtype, device) raised "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0]}: dtype is the dtype's name, the str "
                                f"{dtype!r} (torch's dtype is getattr(torch, dtype))") from exc
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        if len(got) != len(inputs):
            raise ValueError(f"sample() returned {len(got)} tensors, the operator declares {len(inputs)} inputs")
        for i, ((n, _), t, shape, dt) in enumerate(zip(inputs, got, shapes, names, strict=True)):
            if i in scalars:
                if torch.is_tensor(t):
                    raise ValueError(f"sample() returned {n} as a tensor; it is a ScalarArg: return a Python number")
                got[i] = as_declared(t, dt)
                continue
            if not torch.is_tensor(t) or tuple(t.shape) != shape or t.dtype != getattr(torch, dt):
                raise ValueError(f"sample() returned {n} as {getattr(t, 'dtype', type(t).__name__)} "
                                 f"{tuple(getattr(t, 'shape', ()))}; declared {dt} {shape}")
        return got
    g = torch.Generator(device=device).manual_seed(seed)
    out: list[Any] = []  # tensors, and Python numbers for the scalar arguments
    for i, (shape, name) in enumerate(zip(shapes, names, strict=True)):
        dt = getattr(torch, name)
        if i in scalars:
            r = float(torch.rand((), generator=g, device=device))
            out.append(True if name == "bool" else (as_declared(r + 0.5, name) if dt.is_floating_point
                                                    else 1 + int(r * 8)))
        elif dt.is_floating_point:
            out.append(torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dt))
        elif name in ("bool", "uint8"):
            out.append(torch.randint(0, 2, shape, generator=g, device=device, dtype=torch.int32).to(dt))
        else:
            out.append(torch.randint(-8, 8, shape, generator=g, device=device, dtype=torch.int32).to(dt))
    return out


def as_declared(value: Any, dtype: str) -> Any:
    """A float ScalarArg's ``value`` as its declared floating ``dtype`` holds it (the value the kernel is handed:
    ``0.1`` is ``0.10000000149011612`` in a float32), so that the reference computes with the same value; any
    other value (an int, a bool, another dtype's) unchanged. Without it, a float64 operator with a float32 scalar
    failed verification by the scalar's rounding (``|err|`` 1.6e-7 against ``atol`` 1e-8)."""
    import torch

    if type(value) is not float or dtype == "float64":
        return value
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        return value
    return float(torch.tensor(value, dtype=dt))


def point_seed(base: int, spec_id: str, dims: Mapping[str, int]) -> int:
    """Distinct, reproducible data for every (seed, specialization, shape)."""
    return base * 1_000_003 + zlib.crc32(f"{spec_id}|{sorted(dims.items())}".encode()) % 1_000_003
