"""Warm-up: one real call per loaded kernel specialization before a release takes traffic.

    WarmReport  what warm-up did (seconds, calls, failures by spec id)
    warm_up     run it; a kernel that disagrees with its reference is switched to the reference
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from tileship.runtime.dispatch import Release
from tileship.verify.compare import disagreement


@dataclass
class WarmReport:
    """What warm-up did: ``calls`` real calls; ``failures`` spec id -> why it now serves the reference."""

    seconds: float = 0.0
    calls: int = 0
    failures: dict[str, str] = field(default_factory=dict)



def warm_up(release: Release, devices: dict[str, str], *, limit: int = 256, seed: int = 0) -> WarmReport:
    """One real call per loaded kernel specialization, compared with the reference.

    The sample shape is the largest of ``tileship.declare.inputs.sample_points(spec, limit=limit)``
    (the static shape itself for static specializations). A kernel that raises, returns
    non-finite values or disagrees with the reference beyond the declared tolerance is
    switched to the reference (reason ``load_failed``) and listed in ``failures``. An
    operator with no kernel on this device gets one reference call instead (cuBLAS and
    friends initialise lazily). Never compiles.
    """
    import torch

    from tileship.declare.inputs import sample_points
    from tileship.declare.spec import Tolerance, tensor_tolerance
    from tileship.verify.mutated import OnClones, mutated_positions

    t0 = time.perf_counter()
    report = WarmReport()
    for name, runner in release.ops.items():
        device = devices[name]
        tol = release.declarations[name].get("tolerances", {})
        kernels = [e for e in runner.entries if e.kernel is not None and e.spec is not None]
        for entry in kernels:
            spec = entry.spec
            assert spec is not None
            dims = sample_points(spec, limit=limit)[-1]
            args = runner.sample_inputs(dims, spec.dtype, device, seed)
            problem = None
            decl = release.declarations[name]
            mut = mutated_positions(decl)  # inputs updated in place: each path on its own clones, compared whole
            try:
                outs = OnClones(entry.kernel, mut)(*args)  # type: ignore[arg-type]
                refs = OnClones(runner.reference, mut)(*args)
                if device == "cuda":
                    torch.cuda.synchronize()
                names = [n for n, *_ in decl["outputs"]] + [decl["inputs"][i][0] for i in mut]
                for o_name, o, r in zip(names, outs, refs, strict=True):
                    t = tensor_tolerance(release.declarations[name], o_name, spec.dtype) if tol else Tolerance(0.0, 0.0)
                    problem = problem or disagreement(o, r, t.atol, t.rtol)
            except Exception as exc:
                problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            report.calls += 1
            if problem is not None:
                runner.disable(entry, "load_failed", f"warm-up call at {dims}: {problem}")
                report.failures[spec.id] = problem
        if not kernels and runner.entries:
            spec, dims = min(((e.spec, sample_points(e.spec, limit=limit)[0]) for e in runner.entries
                              if e.spec is not None),
                             key=lambda sd: _elements(runner.shape.inputs, sd[1]))
            assert spec is not None
            runner.reference(*runner.sample_inputs(dims, spec.dtype, device, seed))
            report.calls += 1
    if any(d == "cuda" for d in devices.values()):
        torch.cuda.synchronize()
    report.seconds = time.perf_counter() - t0
    return report


def _elements(inputs: Any, dims: dict[str, int]) -> int:
    from tileship.declare.inputs import shapes_of

    return sum(math.prod(s) for s in shapes_of(inputs, dims))
