"""Warm-up: one real call per loaded kernel specialization before a release takes traffic.

    WarmReport  what warm-up did (seconds, calls, failures by spec id)
    warm_up     run it; a kernel that disagrees with its reference is switched to the reference; a reference
                whose answer breaks its declaration is a failure of its own (the kernel stays)
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass, field
from typing import Any

from tileship.runtime.dispatch import Release
from tileship.verify.compare import disagreement


@dataclass
class WarmReport:
    """What warm-up did: ``calls`` real calls; ``failures`` spec id -> why it now serves the reference (or, for a
    reference whose answer breaks the declaration, ``reference: ...``: the kernel is not blamed);
    ``spec_seconds`` spec id -> seconds its warm-up took (its call, the reference's, the comparison)."""

    seconds: float = 0.0
    calls: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    spec_seconds: dict[str, float] = field(default_factory=dict)
    threads: int = 1


def warm_up(release: Release, devices: dict[str, str], *, limit: int = 256, seed: int = 0,
            threads: int = 1) -> WarmReport:
    """One real call per loaded kernel specialization, compared with the reference.

    The sample shape is the largest of ``tileship.declare.inputs.sample_points(spec, limit=limit)``
    (the static shape itself for static specializations). A kernel that raises, returns
    non-finite values or disagrees with the reference beyond the declared tolerance is
    switched to the reference (reason ``load_failed``) and listed in ``failures``. The
    reference's answer is held to the declaration as the dispatcher holds it when it serves
    (``runtime.answer``): one that breaks it (another dtype, shape, device, count or type) is
    listed in ``failures`` as ``reference: ...`` and switches nothing (the kernel is not at
    fault; a hot swap refuses such a release). A ``sample`` hook that raises is listed as ``sample: ...``
    (``making inputs failed``) and switches nothing either (the release still loads; a sticky CUDA error is
    raised). An operator with no kernel on this device gets one reference call instead (cuBLAS and friends
    initialise lazily), held the same way.
    Never compiles.

    ``threads`` > 1 warms specializations on that many threads at once (their host work overlaps;
    on one GPU their kernels still queue on the device). Switching a kernel to the reference
    happens after every call has finished, on the calling thread, so no runner changes while
    another thread calls it.
    """
    import torch

    t0 = time.perf_counter()
    report = WarmReport(threads=max(1, threads))
    jobs: list[tuple[str, Any, Any]] = []
    for name, runner in release.ops.items():
        kernels = [e for e in runner.entries if e.kernel is not None and e.spec is not None]
        jobs += [(name, runner, e) for e in kernels]
        if not kernels and runner.entries:
            jobs.append((name, runner, None))  # the reference once: cuBLAS and friends initialise lazily
    if report.threads > 1 and len(jobs) > 1:
        with concurrent.futures.ThreadPoolExecutor(report.threads, thread_name_prefix="tileship-warmup") as pool:
            done = list(pool.map(lambda job: _one(release, devices, job, limit, seed), jobs))
    else:
        done = [_one(release, devices, job, limit, seed) for job in jobs]
    for (_name, runner, entry), (sid, seconds, dims, problem, blame) in zip(jobs, done, strict=True):
        report.calls += 1
        report.spec_seconds[sid] = seconds
        if problem is None:
            continue
        if blame in ("reference", "sample"):
            report.failures[sid] = f"{blame}: warm-up call at {dims}: {problem}"
        else:
            runner.disable(entry, "load_failed", f"warm-up call at {dims}: {problem}")
            report.failures[sid] = problem
    if any(d == "cuda" for d in devices.values()):
        torch.cuda.synchronize()
    report.seconds = time.perf_counter() - t0
    return report


def _one(release: Release, devices: dict[str, str], job: tuple[str, Any, Any], limit: int,
         seed: int) -> tuple[str, float, dict[str, int], str | None, str]:
    """Warm one job: (spec id, seconds, dims, problem or None, who is blamed: "kernel", "reference" or "sample":
    the operator's ``sample`` hook raised). A job without an entry calls the operator's reference once at its
    smallest declared shape."""
    import torch

    from tileship.declare.inputs import sample_points
    from tileship.declare.spec import Tolerance, tensor_tolerance
    from tileship.errors import DeclarationError
    from tileship.verify.mutated import OnClones, mutated_positions
    from tileship.verify.spec_check import held_at
    from tileship.verify.tune_checks import inputs_failed

    name, runner, entry = job
    device = devices[name]
    decl = release.declarations[name]
    t0 = time.perf_counter()
    if entry is None:
        spec, dims = min(((e.spec, sample_points(e.spec, limit=limit)[0]) for e in runner.entries
                          if e.spec is not None),
                         key=lambda sd: _elements(runner.shape.inputs, sd[1]))
        assert spec is not None
        try:
            args = runner.sample_inputs(dims, spec.dtype, device, seed)
        except Exception as exc:  # noqa: BLE001 -- the operator's sample hook: its failure, not the release's
            return f"{name}:reference", time.perf_counter() - t0, dims, inputs_failed(exc), "sample"
        try:
            held_at(name, runner.reference, decl, dims, args, dtype=spec.dtype)(*args)
        except DeclarationError as exc:
            return f"{name}:reference", time.perf_counter() - t0, dims, exc.message, "reference"
        if device == "cuda":
            torch.cuda.synchronize()
        return f"{name}:reference", time.perf_counter() - t0, dims, None, "reference"
    spec = entry.spec
    tol = decl.get("tolerances", {})
    dims = sample_points(spec, limit=limit)[-1]
    problem = None
    try:
        args = runner.sample_inputs(dims, spec.dtype, device, seed)
    except Exception as exc:  # noqa: BLE001 -- nothing to call the kernel on; no evidence against it either
        return spec.id, time.perf_counter() - t0, dims, inputs_failed(exc), "sample"
    try:
        mut = mutated_positions(decl)  # inputs updated in place: each path on its own clones, compared whole
        outs = OnClones(entry.kernel, mut)(*args)
        try:
            refs = OnClones(held_at(name, runner.reference, decl, dims, args, dtype=spec.dtype), mut)(*args)
        except DeclarationError as exc:
            return spec.id, time.perf_counter() - t0, dims, exc.message, "reference"
        if device == "cuda":
            torch.cuda.synchronize()
        names = [n for n, *_ in decl["outputs"]] + [decl["inputs"][i][0] for i in mut]
        for o_name, o, r in zip(names, outs, refs, strict=True):
            t = tensor_tolerance(decl, o_name, spec.dtype) if tol else Tolerance(0.0, 0.0)
            problem = problem or disagreement(o, r, t.atol, t.rtol)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return spec.id, time.perf_counter() - t0, dims, problem, "kernel"


def _elements(inputs: Any, dims: dict[str, int]) -> int:
    from tileship.declare.inputs import shapes_of

    return sum(math.prod(s) for s in shapes_of(inputs, dims))
