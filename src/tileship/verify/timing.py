"""Timing harness: per-call time of a function over rotating input sets, CUDA events on CUDA, perf_counter on CPU."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the repeat-to-repeat band never goes under this share of the faster median
NOISE_FLOOR = 0.01


#: H200 L2 is 50 MB; inputs smaller than twice the cache are rotated across several sets
CUDA_CACHE_BYTES = 50 * 1024 * 1024


CPU_CACHE_BYTES = 32 * 1024 * 1024


MAX_INPUT_SETS = 16


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
                "iqr_us": _num(self.iqr_us), "repeats": self.repeats, "calls_per_sample": self.inner,
                "input_sets": self.sets}


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


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of ``xs`` (non-empty)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(samples: Sequence[float], repeats: int, inner: int, sets: int) -> Stats:
    return Stats(quantile(samples, 0.5), quantile(samples, 0.1), quantile(samples, 0.9),
                 quantile(samples, 0.75) - quantile(samples, 0.25), repeats, inner, sets, tuple(samples))


def measure(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], *, device: str, warmup_ms: float = 25.0,
            budget_ms: float = 100.0, min_repeats: int = 5, max_repeats: int = 50, flush: Any = None) -> Stats:
    """Per-call time of ``fn`` over rotating ``arg_sets``: warm-up, then ``repeats`` samples of
    ``inner`` back-to-back calls each (CUDA events on CUDA, perf_counter on CPU). ``flush`` (a
    tensor at least the size of the L2, see ``l2_flush_buffer``) is overwritten before every
    sample, outside the timed span, so no sample starts with the previous one's data cached."""
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
            if flush is not None:
                flush.zero_()
            starts[r].record()
            for _ in range(inner):
                fn(*arg_sets[k % n])
                k += 1
            ends[r].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 / inner for s, e in zip(starts, ends, strict=True)]
    else:
        for _ in range(repeats):
            if flush is not None:
                flush.zero_()
            t = time.perf_counter()
            for _ in range(inner):
                fn(*arg_sets[k % n])
                k += 1
            samples.append((time.perf_counter() - t) * 1e6 / inner)
    return _stats(samples, repeats, inner, n)


def round_spread(medians: Sequence[float]) -> float:
    """The noise band of one path from its round medians: twice their median absolute deviation.
    With two rounds that is their difference; with three or more, one disturbed round (a hiccup of
    the host) cannot widen it, while rounds that disagree among themselves still do."""
    if len(medians) < 2:
        return 0.0
    c = quantile(medians, 0.5)
    return 2 * quantile([abs(m - c) for m in medians], 0.5)


def l2_flush_buffer(device: str) -> Any:
    """A scratch tensor twice the size of the last-level cache (the L2 on CUDA) for ``measure(flush=)``."""
    import torch

    size = CPU_CACHE_BYTES
    if device == "cuda":
        size = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or CUDA_CACHE_BYTES
    return torch.empty(2 * size // 4, dtype=torch.int32, device=device)


def rotation_sets(first: Sequence[Any], make: Callable[[int], Sequence[Any]], *, device: str,
                  out_bytes: int) -> list[Sequence[Any]]:
    """``first`` plus enough fresh input sets that one pass over them overflows the cache."""
    cache = CUDA_CACHE_BYTES if device == "cuda" else CPU_CACHE_BYTES
    if device == "cuda":
        import torch

        cache = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or cache
    per_set = sum(int(a.numel()) * a.element_size() for a in first if hasattr(a, "numel")) + out_bytes
    n = 1 if per_set >= 2 * cache else min(MAX_INPUT_SETS, math.ceil(2 * cache / max(per_set, 1)))
    return [first, *(make(i) for i in range(1, n))]


def _num(v: Any) -> Any:
    """JSON has no NaN/Inf: those become None (the failure text says what happened)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
