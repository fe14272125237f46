"""Roofline evidence: the ceilings of the device verify runs on, and each timed shape against them.

``measure_ceilings(device)`` times, on the device itself, a large copy (HBM or DRAM bandwidth:
bytes read + written per second) and a large matmul per float dtype (cuBLAS on CUDA, the CPU
BLAS on the CPU): the best the hardware does for the simplest memory-bound and compute-bound
work, measured rather than taken from a datasheet.

``annotate(points, cost, dtype, ceilings)`` adds to every timed point of a specialization the
work an operator declares for it (``Operator.cost(dims, dtype) -> (flops, bytes)``), what the
kernel and the reference achieved (FLOP/s, bytes/s, each as a share of the ceiling), the bound
(memory when the arithmetic intensity is below the ridge point flops_peak / bytes_peak,
compute otherwise) and the share of that bound's ceiling each path reaches.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
#: sizes of the ceiling runs: big enough to leave caches and launch overhead far behind
CUDA_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 1 << 28
CUDA_GEMM = 8192
CPU_GEMM = 1024


def _cuda_time(fn: Callable[[], Any], reps: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _cpu_time(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: str) -> dict[str, Any]:
    """``{"device", "bytes_per_s", "flops_per_s": {dtype: flop/s}, "method"}`` measured on ``device``
    ("cuda" or "cpu"). Frees what it allocates; raises only what torch raises."""
    import torch

    cuda = device == "cuda"
    timer, reps = (_cuda_time, 10) if cuda else (_cpu_time, 3)
    nbytes = CUDA_COPY_BYTES if cuda else CPU_COPY_BYTES
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    bytes_per_s = 2 * nbytes / timer(functools.partial(dst.copy_, src), reps)
    del src, dst
    n = CUDA_GEMM if cuda else CPU_GEMM
    flops: dict[str, float] = {}
    for name in FLOAT_DTYPES if cuda else ("float32",):
        dt = getattr(torch, name)
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        flops[name] = 2 * n**3 / timer(functools.partial(torch.matmul, a, b), reps)
        del a, b
    if cuda:
        torch.cuda.empty_cache()
    return {"device": device, "bytes_per_s": bytes_per_s, "flops_per_s": flops,
            "method": f"median of {reps}: a {nbytes >> 20} MiB copy (bytes read + written), "
                      f"a {n}^3 matmul per dtype ({'cuBLAS' if cuda else 'CPU BLAS'})"}


def _peak_flops(ceilings: Mapping[str, Any], dtype: str) -> float:
    by_dtype = ceilings["flops_per_s"]
    return float(by_dtype.get(dtype) or max(by_dtype.values()))


def point_roofline(flops: float, nbytes: float, kernel_us: float | None, reference_us: float | None,
                   dtype: str, ceilings: Mapping[str, Any]) -> dict[str, Any]:
    """The roofline entry of one shape (see the module docstring). Shares are in percent."""
    peak_f, peak_b = _peak_flops(ceilings, dtype), float(ceilings["bytes_per_s"])
    intensity = flops / nbytes if nbytes > 0 else float("inf")
    ridge = peak_f / peak_b
    bound = "memory" if intensity < ridge else "compute"
    out: dict[str, Any] = {"flops": flops, "bytes": nbytes, "intensity": intensity, "ridge": ridge, "bound": bound}
    for name, us in (("kernel", kernel_us), ("reference", reference_us)):
        if not us:
            continue
        secs = us * 1e-6
        pct_f, pct_b = 100 * flops / secs / peak_f, 100 * nbytes / secs / peak_b
        out[name] = {"flops_per_s": flops / secs, "bytes_per_s": nbytes / secs, "pct_peak_flops": pct_f,
                     "pct_peak_bytes": pct_b, "pct_of_bound": pct_b if bound == "memory" else pct_f}
    return out


def annotate(points: Sequence[dict[str, Any]], cost: Callable[[Mapping[str, int], str], tuple[float, float]],
             dtype: str, ceilings: Mapping[str, Any]) -> None:
    """Add ``"roofline"`` to every timed point (in place). A cost function that raises leaves the
    point without one and records why, never failing verification."""
    for point in points:
        timing = point.get("timing")
        if not timing:
            continue
        try:
            flops, nbytes = cost(point["dims"], dtype)
        except Exception as exc:  # noqa: BLE001 - a user's cost model must not fail verification
            point["roofline"] = {"error": f"cost model raised {type(exc).__name__}: {exc}"[:300]}
            continue
        point["roofline"] = point_roofline(float(flops), float(nbytes), timing["kernel"]["median_us"],
                                           timing["reference"]["median_us"], dtype, ceilings)


def add_to_evidence(data: dict[str, Any], verdicts: Sequence[Any], operators: Mapping[str, Mapping[str, Any]],
                    import_cost: Callable[[str, str], Any]) -> None:
    """Measure the ceilings of every device type that timed an operator declaring a cost model, put
    them in ``data["ceilings"]`` and annotate those operators' points. An operator whose cost model
    cannot be imported is listed in ``data["roofline_skipped"]`` with the reason (never an error)."""
    costs: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for op in sorted({v.spec.op for v in verdicts}):
        path = operators.get(op, {}).get("cost")
        if not path:
            continue
        try:
            costs[op] = import_cost(path, op)
        except Exception as exc:  # noqa: BLE001 - reported in the evidence, verification goes on
            skipped[op] = str(exc)[:300]
    timed = [v for v in verdicts if v.spec.op in costs and any(p.timing for p in v.points)]
    ceilings = {dt: measure_ceilings(dt) for dt in sorted({v.device_type for v in timed})}
    for v in timed:
        annotate(data["specializations"][v.spec.id]["points"], costs[v.spec.op], v.spec.dtype, ceilings[v.device_type])
    if ceilings:
        data["ceilings"] = ceilings
    if skipped:
        data["roofline_skipped"] = skipped
