"""Verify a release on the device it will serve on; store the evidence with the release.

For every specialization this machine can run (CUDA ones on a GPU, ``"c"`` ones anywhere):

- correctness at several shapes (static: the shape; ``T.dynamic``: 1, a size that is not a
  multiple of the block, the maximum, and a geometric grid in between), each with fresh
  random inputs from several seeds (never zeros), against the reference computed in float64
  (float32 where the reference cannot run in float64; recorded). Outputs are poisoned with a
  NaN of a distinctive bit pattern before each run, so an element the kernel never wrote is
  told apart from a NaN it computed; NaN/Inf never pass; thresholds are the operator's
  declared per-dtype atol/rtol (|out - ref| <= atol + rtol * |ref| for every element),
  overridable per operator and dtype (``VerifyOptions.tolerances``);
- speed of kernel and reference as served (the kernel allocates its output): warm-up, then
  batches of back-to-back calls timed with CUDA events (perf_counter on CPU); median,
  p10/p90 and IQR per call; inputs rotated across several sets when they would fit in the
  cache; each path measured twice (kernel, reference, kernel, reference) and the difference
  between the two repeats of the same measurement is the noise band: a kernel/reference
  difference within it is "no difference".

``verify`` writes ``evidence/verification.json`` (see ``tileship.evidence``) and re-hashes
the release; the release id does not change. The evidence is replaced as a whole. Never
compiles: artifacts are loaded from the bundle with the no-JIT guard installed.

Poisoning. TileLang allocates the outputs (``out_idx``), so the poison goes where the
allocation comes from: ``torch.empty`` is swapped for the duration of one kernel call (the
Cython and Python TVM-FFI adapters allocate through it), and on CUDA the caching allocator is
handed back blocks of exactly the output sizes that hold the poison (TVM-FFI's callee-allocated
outputs come from there). Every run checks that each output really is a poisoned block (by
address; the caching allocator keeps freed contents) and fails when it cannot confirm it,
unless ``strict_poison`` is off. This swaps a global: run verification in one thread.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import evidence as ev_mod
from .errors import ArtifactLoadError, VerificationError
from .inputs import sample_points
from .spec import Specialization, Target, Tolerance

#: NaN payloads nothing computes (canonical NaNs are 0x7FC00000 / 0xFFC00000 and friends)
POISON_BITS = {"float32": ("int32", 0x7FC0DEAD), "float16": ("int16", 0x7E6D), "bfloat16": ("int16", 0x7FED),
               "float64": ("int64", 0x7FF80000DEADBEEF), "int32": ("int32", 0x5A5A5A5A), "int8": ("int8", 0x5A)}
#: the repeat-to-repeat band never goes under this share of the faster median
NOISE_FLOOR = 0.01
#: H200 L2 is 50 MB; inputs smaller than twice the cache are rotated across several sets
CUDA_CACHE_BYTES = 50 * 1024 * 1024
CPU_CACHE_BYTES = 32 * 1024 * 1024
MAX_INPUT_SETS = 16


@dataclass(frozen=True)
class VerifyOptions:
    seeds: tuple[int, ...] = (0, 1, 2)
    #: cap on the sizes of a T.dynamic dim (None: up to the declared maximum)
    limit: int | None = None
    #: ratio between successive verified sizes of a T.dynamic dim (besides the edge sizes); 0: edges only
    grid: int = 4
    timing: bool = True
    warmup_ms: float = 25.0
    #: measured time per timing run (each path is timed twice)
    budget_ms: float = 100.0
    min_repeats: int = 5
    max_repeats: int = 50
    reference_dtype: str = "float64"
    #: operator -> dtype -> Tolerance, replacing the declared one
    tolerances: Mapping[str, Mapping[str, Tolerance]] = field(default_factory=dict)
    #: device types to verify ("cuda", "cpu"); specializations of others are skipped
    devices: tuple[str, ...] = ("cuda", "cpu")
    #: operator names or specialization ids to verify (empty: all)
    only: tuple[str, ...] = ()
    strict_poison: bool = True
    on_point: Callable[[str, PointResult], None] | None = None


# -- results (values, not exceptions) ------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One output of one run compared with the float64 reference."""

    numel: int
    unwritten: int
    nonfinite: int
    mismatches: int
    max_abs_err: float | None
    rel_l2_err: float | None
    #: worst element's |err| / (atol + rtol |ref|): <= 1 passes
    tol_ratio: float | None
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        return {k: _num(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Stats:
    """Per-call time of one timing run, microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    iqr_us: float
    repeats: int
    inner: int
    sets: int
    samples: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"median_us": _num(self.median_us), "p10_us": _num(self.p10_us), "p90_us": _num(self.p90_us),
                "iqr_us": _num(self.iqr_us), "repeats": self.repeats, "calls_per_sample": self.inner, "input_sets": self.sets}


@dataclass(frozen=True)
class Timing:
    kernel: Stats
    reference: Stats
    #: |median of run 1 - median of run 2| of the same path, the larger of the two paths
    noise_us: float
    verdict: str
    repeat_medians_us: Mapping[str, tuple[float, float]]

    @property
    def speedup(self) -> float:
        return self.reference.median_us / self.kernel.median_us if self.kernel.median_us > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel.to_json(), "reference": self.reference.to_json(), "noise_us": _num(self.noise_us),
                "verdict": self.verdict, "speedup": _num(self.speedup),
                "repeat_medians_us": {k: [_num(a), _num(b)] for k, (a, b) in self.repeat_medians_us.items()}}


@dataclass(frozen=True)
class PointResult:
    """One verified shape: a check per seed (and per output), the reference's own error, timing."""

    dims: Mapping[str, int]
    checks: tuple[tuple[int, Check], ...]
    reference_checks: tuple[Check, ...]
    poison_confirmed: bool
    failure: str | None
    timing: Timing | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def worst(self, attr: str) -> float | None:
        vals = [getattr(c, attr) for _, c in self.checks if getattr(c, attr) is not None]
        return max(vals) if vals else None

    def to_json(self) -> dict[str, Any]:
        ref_ratio = [c.tol_ratio for c in self.reference_checks if c.tol_ratio is not None]
        ref_l2 = [c.rel_l2_err for c in self.reference_checks if c.rel_l2_err is not None]
        return {"dims": dict(self.dims), "passed": self.passed, "failure": self.failure, "poison_confirmed": self.poison_confirmed,
                "max_abs_err": _num(self.worst("max_abs_err")), "rel_l2_err": _num(self.worst("rel_l2_err")),
                "tol_ratio": _num(self.worst("tol_ratio")),
                "reference_tol_ratio": _num(max(ref_ratio) if ref_ratio else None),
                "reference_rel_l2_err": _num(max(ref_l2) if ref_l2 else None),
                "checks": [{"seed": s, **c.to_json()} for s, c in self.checks],
                "timing": self.timing.to_json() if self.timing else None}


@dataclass(frozen=True)
class SpecVerdict:
    spec: Specialization
    device_type: str
    tolerance: Tolerance
    tolerance_overridden: bool
    reference_dtype: str
    points: tuple[PointResult, ...]
    failure: str | None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        points = [p.to_json() for p in self.points]
        route, why = ev_mod.pinned_mark(points, self.passed)
        return {"op": self.spec.op, "dtype": self.spec.dtype, "target": self.spec.target, "device_type": self.device_type,
                "dynamic_dim": self.spec.dynamic_dim, "passed": self.passed, "failure": self.failure,
                "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol, "overridden": self.tolerance_overridden},
                "reference_dtype": self.reference_dtype, "route": route, "route_reason": why, "points": points}


@dataclass(frozen=True)
class VerifyResult:
    release_id: str
    path: Path
    verdicts: tuple[SpecVerdict, ...]
    #: spec id -> why it was not verified here (no GPU, build failed, filtered out)
    skipped: Mapping[str, str]
    evidence: Mapping[str, Any]

    @property
    def failed(self) -> list[SpecVerdict]:
        return [v for v in self.verdicts if not v.passed]

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and not self.failed


def _num(v: Any) -> Any:
    """JSON has no NaN/Inf: those become None (the failure text says what happened)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# -- correctness ---------------------------------------------------------------------

def _poison_pattern(dtype: Any) -> tuple[Any, int]:
    """(integer view dtype, poison bits as a signed value of that width) for a float dtype."""
    import torch

    view, bits = POISON_BITS[str(dtype).removeprefix("torch.")]
    width = torch.iinfo(getattr(torch, view)).bits
    return getattr(torch, view), bits - (1 << width) if bits >= 1 << (width - 1) else bits


def fill_poison(t: Any) -> Any:
    """Fill ``t`` in place with the poison bit pattern of its dtype. Returns ``t``."""
    view, signed = _poison_pattern(t.dtype)
    t.view(view).fill_(signed)
    return t


def poison_mask(t: Any) -> Any:
    """Elements of ``t`` still bit-identical to the poison (never written)."""
    view, signed = _poison_pattern(t.dtype)
    return t.contiguous().view(view) == signed


def poisoned_call(kernel: Callable[..., Any], args: Sequence[Any], outputs: Sequence[tuple[tuple[int, ...], Any]]) -> tuple[list[Any], bool]:
    """Run ``kernel(*args)`` with every output it allocates pre-filled with the poison.

    ``outputs``: (shape, torch dtype) of each output, for the CUDA allocator. Returns the
    outputs and whether each was confirmed to be a poisoned block. Raises what the kernel
    raises; on CUDA synchronizes, so a launch error surfaces here.
    """
    import torch

    device = args[0].device
    made: list[Any] = []
    real_empty = torch.empty

    def poisoned_empty(*size: Any, **kw: Any) -> Any:
        t = real_empty(*size, **kw)
        if str(t.dtype).removeprefix("torch.") in POISON_BITS and t.numel():
            fill_poison(t)
            made.append(t)
        return t

    handed_back: set[int] = set()
    if device.type == "cuda":
        # Same requests, freed in reverse: the allocator state is as before, so the kernel's
        # identical requests get these very blocks back (contents survive a free).
        blocks = [fill_poison(real_empty(shape, dtype=dt, device=device)) for shape, dt in outputs]
        handed_back = {b.data_ptr() for b in blocks}
        while blocks:
            del blocks[-1]
    torch.empty = poisoned_empty
    try:
        result = kernel(*args)
    finally:
        torch.empty = real_empty
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    outs = list(result) if isinstance(result, (list, tuple)) else [result]
    ours = {t.data_ptr() for t in made} | handed_back
    return outs, all(o.data_ptr() in ours for o in outs)


def check_output(out: Any, ref: Any, *, atol: float, rtol: float) -> Check:
    """Compare ``out`` with the high-precision ``ref`` element by element."""
    import torch

    numel = int(ref.numel())
    if tuple(out.shape) != tuple(ref.shape):
        return Check(int(out.numel()), 0, 0, 0, None, None, None, failure=f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    unwritten = poison_mask(out) if str(out.dtype).removeprefix("torch.") in POISON_BITS else torch.zeros(out.shape, dtype=torch.bool, device=out.device)
    o = out.to(torch.float64)
    r = ref.to(device=out.device, dtype=torch.float64)
    ref_bad = int((~torch.isfinite(r)).sum())
    nonfinite = ~torch.isfinite(o) & ~unwritten
    err = (o - r).abs()
    bound = atol + rtol * r.abs()
    finite = torch.isfinite(o) & torch.isfinite(r)
    ok = err <= bound  # False for NaN
    mismatches = finite & ~ok
    n_unw, n_nf, n_mis = int(unwritten.sum()), int(nonfinite.sum()), int(mismatches.sum())
    max_abs = float(err[finite].max()) if bool(finite.any()) else None
    rnorm = float(torch.linalg.vector_norm(r[finite])) if bool(finite.any()) else 0.0
    rel_l2 = float(torch.linalg.vector_norm(o[finite] - r[finite])) / rnorm if rnorm > 0 else None
    ratio_t = torch.where(bound > 0, err / bound.clamp_min(1e-300), torch.where(err > 0, math.inf, 0.0))
    tol_ratio = float(ratio_t[finite].max()) if bool(finite.any()) else None

    def first(mask: Any) -> int:
        return int(mask.reshape(-1).nonzero()[0, 0])

    failure = None
    if ref_bad:
        failure = f"the reference produced {ref_bad} non-finite values: the inputs are outside the operator's domain"
    elif n_unw:
        failure = f"{n_unw} of {numel} elements never written (still hold the NaN poison), first at flat index {first(unwritten)}"
    elif n_nf:
        failure = f"{n_nf} of {numel} elements are NaN/Inf, first at flat index {first(nonfinite)}"
    elif n_mis:
        i = first(mismatches)
        failure = (f"{n_mis} of {numel} elements beyond atol={atol:g} + rtol={rtol:g}*|ref|, first at flat index {i} "
                   f"(got {o.reshape(-1)[i].item():.6g}, want {r.reshape(-1)[i].item():.6g}); max |err| {max_abs:.3g}")
    return Check(numel, n_unw, n_nf, n_mis, max_abs, rel_l2, tol_ratio, failure)


# -- inputs and shapes -----------------------------------------------------------------

def verification_points(spec: Specialization, *, block: int = 128, grid: int = 4, limit: int | None = None) -> list[dict[str, int]]:
    """Shapes to verify ``spec`` at: the edges of ``tileship.inputs.sample_points`` (1, a size
    not a multiple of ``block``, the middle, the maximum), plus powers of ``grid`` in between."""
    dims = spec.dim_map()
    dyn = spec.dynamic_dim
    edges = sample_points(spec, block=block, limit=limit)
    if dyn is None:
        return [{d: int(dims[d]) for d, _ in spec.dims}]  # type: ignore[arg-type]
    lo, hi = dims[dyn]  # type: ignore[misc]
    top = hi if limit is None else max(lo, min(hi, limit))
    sizes = {p[dyn] for p in edges}
    if grid >= 2:
        v = 1
        while v <= top:
            if v >= lo:
                sizes.add(v)
            v *= grid
    return [{d: (s if d == dyn else int(dims[d])) for d, _ in spec.dims} for s in sorted(sizes)]  # type: ignore[arg-type]


def make_args(inputs: Sequence[tuple[str, Sequence[str]]], dims: Mapping[str, int], dtype: str, device: str, seed: int) -> list[Any]:
    """Fresh standard-normal inputs (integers in [-8, 8) for int dtypes); drawn on the device itself."""
    import torch

    if device == "cpu":
        from .inputs import make_inputs

        return make_inputs(inputs, dict(dims), dtype, device, seed)
    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, dtype)
    out = []
    for _, ds in inputs:
        shape = tuple(dims[d] for d in ds)
        if dt.is_floating_point:
            out.append(torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dt))
        else:
            out.append(torch.randint(-8, 8, shape, generator=g, device=device, dtype=torch.int32).to(dt))
    return out


def point_seed(base: int, spec_id: str, dims: Mapping[str, int]) -> int:
    """Distinct, reproducible data for every (seed, specialization, shape)."""
    return base * 1_000_003 + zlib.crc32(f"{spec_id}|{sorted(dims.items())}".encode()) % 1_000_003


# -- timing ----------------------------------------------------------------------------

def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(samples: Sequence[float], repeats: int, inner: int, sets: int) -> Stats:
    return Stats(_quantile(samples, 0.5), _quantile(samples, 0.1), _quantile(samples, 0.9),
                 _quantile(samples, 0.75) - _quantile(samples, 0.25), repeats, inner, sets, tuple(samples))


def measure(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], *, device: str, warmup_ms: float = 25.0,
            budget_ms: float = 100.0, min_repeats: int = 5, max_repeats: int = 50) -> Stats:
    """Per-call time of ``fn`` over rotating ``arg_sets``: warm-up, then ``repeats`` samples of
    ``inner`` back-to-back calls each (CUDA events on CUDA, perf_counter on CPU)."""
    import torch

    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    n = len(arg_sets)
    calls, chunk = 0, 1
    sync()
    t0 = time.perf_counter()
    while True:  # warm-up in doubling chunks; also estimates one call's cost
        for _ in range(chunk):
            fn(*arg_sets[calls % n])
            calls += 1
        sync()
        elapsed = (time.perf_counter() - t0) * 1e3
        if elapsed >= warmup_ms and calls >= 3:
            break
        chunk = min(chunk * 2, 1024)
    est_ms = max(elapsed / calls, 1e-4)
    inner = max(1, min(10_000, math.ceil((0.2 if cuda else 1.0) / est_ms)))
    repeats = max(min_repeats, min(max_repeats, int(budget_ms / (inner * est_ms))))
    samples: list[float] = []
    k = 0
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for r in range(repeats):
            starts[r].record()
            for _ in range(inner):
                fn(*arg_sets[k % n])
                k += 1
            ends[r].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 / inner for s, e in zip(starts, ends, strict=True)]
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(inner):
                fn(*arg_sets[k % n])
                k += 1
            samples.append((time.perf_counter() - t) * 1e6 / inner)
    return _stats(samples, repeats, inner, n)


def time_pair(kernel: Callable[..., Any], reference: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], *, device: str,
              options: VerifyOptions = VerifyOptions()) -> Timing:
    """Kernel and reference, each timed twice (K, R, K, R); the repeat spread is the noise band."""
    kw = {"device": device, "warmup_ms": options.warmup_ms, "budget_ms": options.budget_ms,
          "min_repeats": options.min_repeats, "max_repeats": options.max_repeats}
    k1 = measure(kernel, arg_sets, **kw)  # type: ignore[arg-type]
    r1 = measure(reference, arg_sets, **kw)  # type: ignore[arg-type]
    k2 = measure(kernel, arg_sets, **kw)  # type: ignore[arg-type]
    r2 = measure(reference, arg_sets, **kw)  # type: ignore[arg-type]
    k = _stats(k1.samples + k2.samples, k1.repeats + k2.repeats, k1.inner, k1.sets)
    r = _stats(r1.samples + r2.samples, r1.repeats + r2.repeats, r1.inner, r1.sets)
    noise = max(abs(k1.median_us - k2.median_us), abs(r1.median_us - r2.median_us), NOISE_FLOOR * min(k.median_us, r.median_us))
    return Timing(k, r, noise, ev_mod.compare_times(k.median_us, r.median_us, noise),
                  {"kernel": (k1.median_us, k2.median_us), "reference": (r1.median_us, r2.median_us)})


def rotation_sets(first: Sequence[Any], make: Callable[[int], Sequence[Any]], *, device: str, out_bytes: int) -> list[Sequence[Any]]:
    """``first`` plus enough fresh input sets that one pass over them overflows the cache."""
    cache = CUDA_CACHE_BYTES if device == "cuda" else CPU_CACHE_BYTES
    if device == "cuda":
        import torch

        cache = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or cache
    per_set = sum(int(a.numel()) * a.element_size() for a in first) + out_bytes
    n = 1 if per_set >= 2 * cache else min(MAX_INPUT_SETS, math.ceil(2 * cache / max(per_set, 1)))
    return [first, *(make(i) for i in range(1, n))]


# -- the driver ------------------------------------------------------------------------

def dynamic_block(config: Mapping[str, Any], dim: str | None) -> int:
    """The tile size along ``dim`` from an operator's config (``block_<dim>``, ``block``), else 128."""
    for key in (f"block_{dim}", "block", "block_M"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 128


def _reference_in(reference: Callable[..., Any], args: Sequence[Any], dtype: str) -> list[Any]:
    import torch

    up = [a.to(getattr(torch, dtype)) if a.dtype.is_floating_point else a for a in args]
    out = reference(*up)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def verify_spec(spec: Specialization, kernel: Callable[..., Any], reference: Callable[..., Any], desc: Mapping[str, Any], *,
                options: VerifyOptions = VerifyOptions(), tolerance: Tolerance | None = None) -> SpecVerdict:
    """Check (and time) one loaded specialization at its verification points."""
    import torch

    device = Target(spec.target).device_type
    inputs = [(n, tuple(ds)) for n, ds in desc["inputs"]]
    outputs = [(n, tuple(ds)) for n, ds in desc["outputs"]]
    declared = desc.get("tolerances", {}).get(spec.dtype)
    override = options.tolerances.get(spec.op, {}).get(spec.dtype)
    tol = tolerance or override or (Tolerance(declared["atol"], declared["rtol"]) if declared else Tolerance(*_default_tol(spec.dtype)))
    ref_dtype = options.reference_dtype
    dt = getattr(torch, spec.dtype)
    points: list[PointResult] = []
    for dims in verification_points(spec, block=dynamic_block(desc.get("config", {}), spec.dynamic_dim), grid=options.grid, limit=options.limit):
        checks: list[tuple[int, Check]] = []
        ref_checks: list[Check] = []
        confirmed = True
        failure = None
        first_args: list[Any] | None = None
        out_specs = [(tuple(dims[d] for d in ds), dt) for _, ds in outputs]
        for base in options.seeds:
            seed = point_seed(base, spec.id, dims)
            args = make_args(inputs, dims, spec.dtype, device, seed)
            first_args = first_args or args
            try:
                outs, ok_poison = poisoned_call(kernel, args, out_specs)
            except Exception as exc:  # noqa: BLE001 -- a kernel that raises fails verification; the message is the evidence
                failure = f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            confirmed = confirmed and ok_poison
            try:
                refs = _reference_in(reference, args, ref_dtype)
            except (RuntimeError, NotImplementedError, TypeError):
                if ref_dtype == "float32":
                    raise
                ref_dtype = "float32"  # e.g. no float64 implementation on this device
                refs = _reference_in(reference, args, ref_dtype)
            native = _reference_in(reference, args, spec.dtype)
            for i, (o, r, n) in enumerate(zip(outs, refs, native, strict=True)):
                c = check_output(o, r, atol=tol.atol, rtol=tol.rtol)
                checks.append((seed, c))
                ref_checks.append(check_output(n, r, atol=tol.atol, rtol=tol.rtol))
                if c.failure and failure is None:
                    failure = (f"output {outputs[i][0]}: " if len(outs) > 1 else "") + c.failure + f" (seed {seed})"
            del outs, refs, native
        if failure is None and not confirmed and options.strict_poison:
            failure = ("could not confirm the outputs were poisoned (the adapter allocated them outside the poisoned allocator), "
                       "so unwritten elements would go unseen; use --no-strict-poison to accept")
        timing = None
        if failure is None and options.timing and first_args is not None:
            out_bytes = sum(math.prod(s) for s, _ in out_specs) * torch.empty((), dtype=dt).element_size()

            def fresh(i: int, d: Mapping[str, int] = dims) -> list[Any]:
                return make_args(inputs, d, spec.dtype, device, point_seed(10_000 + i, spec.id, d))

            sets = rotation_sets(first_args, fresh, device=device, out_bytes=out_bytes)
            timing = time_pair(kernel, reference, sets, device=device, options=options)
            del sets
        point = PointResult(dims, tuple(checks), tuple(ref_checks), confirmed, failure, timing)
        points.append(point)
        if options.on_point:
            options.on_point(spec.id, point)
    bad = next((p for p in points if not p.passed), None)
    failure = None if bad is None else f"at {','.join(f'{k}={v}' for k, v in bad.dims.items())}: {bad.failure}"
    return SpecVerdict(spec, device, tol, override is not None, ref_dtype, tuple(points), failure)


def _default_tol(dtype: str) -> tuple[float, float]:
    from .spec import DEFAULT_TOLERANCES

    return DEFAULT_TOLERANCES[dtype]


def verify(path: Path | str, options: VerifyOptions = VerifyOptions(), *, write: bool = True) -> VerifyResult:
    """Verify every specialization of the release at ``path`` that this machine can run.

    Raises BundleIntegrityError for a release that is not intact, VerificationError when
    nothing can be verified here or the environment drifted from the lock in a blocking way
    (evidence taken there would not describe the artifacts). A kernel that is wrong is a
    value (``SpecVerdict.failure``), not an exception. With ``write``, stores the evidence.
    """
    import json

    import torch

    from . import bundle, env, nojit
    from .loader import _import_reference, load_artifact
    from .lock import capture_environment, compare, lock_digest, read_lock

    root = Path(path)
    manifest = bundle.check_integrity(root)
    rel = json.loads((root / "release.json").read_text())
    lock = read_lock(root / "tileship.lock")
    drift = compare(lock, capture_environment())
    if drift.blocking:
        raise VerificationError(f"blocking drift against the release lock ({drift.reason}): evidence taken here would not describe these artifacts",
                                hint="run `tileship check` on this machine; verify where the release will serve, with the locked toolchain")
    unknown = sorted(n for n in options.tolerances if n not in rel["operators"])
    if unknown:
        raise VerificationError(f"tolerance override for unknown operator(s) {unknown} (release has: {', '.join(sorted(rel['operators']))})")
    env.ensure_tilelang_cache_dir()
    nojit.install()
    cuda = torch.cuda.is_available()
    verdicts: list[SpecVerdict] = []
    skipped: dict[str, str] = {}
    references: dict[str, Any] = {}
    for sid, info in sorted(rel["specializations"].items()):
        spec = Specialization.from_json(info["spec"])
        target = Target(spec.target)
        if options.only and spec.op not in options.only and sid not in options.only:
            skipped[sid] = "not selected"
            continue
        if info["status"] != "built":
            skipped[sid] = "build failed"
            continue
        if target.device_type not in options.devices:
            skipped[sid] = f"{target.device_type} not selected"
            continue
        if target.device_type == "cuda":
            if not cuda:
                skipped[sid] = "no CUDA GPU here"
                continue
            if tuple(torch.cuda.get_device_capability(0)) != target.compute_capability:
                skipped[sid] = f"built for {target.arch}, this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}"
                continue
        desc = rel["operators"][spec.op]
        if spec.op not in references:
            references[spec.op] = _import_reference(desc, spec.op)
        try:
            kernel = load_artifact(root / "specs" / sid, sid)
        except ArtifactLoadError as exc:
            tol = Tolerance(**{k: desc["tolerances"][spec.dtype][k] for k in ("atol", "rtol")})
            verdicts.append(SpecVerdict(spec, target.device_type, tol, False, options.reference_dtype, (), f"artifact failed to load: {exc}"))
            continue
        verdicts.append(verify_spec(spec, kernel, references[spec.op], desc, options=options))
        del kernel
    if not verdicts:
        raise VerificationError(f"nothing to verify on this machine ({len(skipped)} specializations skipped: "
                                f"{', '.join(sorted(set(skipped.values())))})",
                                hint="run `tileship verify` on the GPU the release will serve on")
    data = {
        "schema": ev_mod.SCHEMA,
        "release_id": manifest["release_id"],
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lock_digest": lock_digest(lock),
        "device": ev_mod.current_device(),
        "host": ev_mod.current_host(),
        "options": {"seeds": list(options.seeds), "limit": options.limit, "grid": options.grid, "timing": options.timing,
                    "warmup_ms": options.warmup_ms, "budget_ms": options.budget_ms, "min_repeats": options.min_repeats,
                    "max_repeats": options.max_repeats, "reference_dtype": options.reference_dtype, "noise_floor": NOISE_FLOOR,
                    "strict_poison": options.strict_poison,
                    "tolerance_overrides": {op: {dt: {"atol": t.atol, "rtol": t.rtol} for dt, t in m.items()} for op, m in options.tolerances.items()}},
        "skipped": dict(sorted(skipped.items())),
        "specializations": {v.spec.id: v.to_json() for v in verdicts},
    }
    if write:
        ev_mod.write(root, data)
    return VerifyResult(manifest["release_id"], root, tuple(verdicts), skipped, data)
