"""The demo's third step: call every specialization this machine can run and compare."""

from __future__ import annotations

from typing import Any

from tileship.declare.inputs import make_inputs, sample_points
from tileship.runtime.dispatch import Release
from tileship.verify.compare import disagreement


def exercise(release: Release, *, seed: int = 0, limit: int = 4096) -> list[dict[str, Any]]:
    """One row per (specialization, sample shape): path, reason, max abs error vs the reference
    computed in float64, and whether it is within the operator's tolerance. Specializations
    for a device this machine lacks are listed with ``ok=None`` and not called."""
    import torch

    rows: list[dict[str, Any]] = []
    for name, runner in release.ops.items():
        decl = release.declarations[name]
        for entry in runner.entries:
            spec = entry.spec
            assert spec is not None
            device = "cpu" if spec.target == "c" else "cuda"
            runnable = device == "cpu" or torch.cuda.is_available()
            tol = decl["tolerances"][spec.dtype]
            for dims in sample_points(spec, limit=limit):
                shown = ",".join(f"{k}={v}" for k, v in dims.items())
                if not runnable:
                    rows.append({"spec_id": spec.id, "dims": shown, "path": "-", "reason": "no GPU here: " + entry.decision.reason, "err": "-", "ok": None})
                    continue
                args = make_inputs(runner.shape.inputs, dims, spec.dtype, device, seed)
                out, d = runner.call(*args)
                ref = runner.reference(*[a.double() for a in args])
                err = (out.double() - ref).abs()
                ok = bool(torch.isfinite(out).all()) and disagreement(out, ref, tol["atol"], tol["rtol"]) is None
                rows.append({"spec_id": d.spec_id or spec.id, "dims": shown, "path": d.path, "reason": d.reason, "err": f"{err.max().item():.2e}", "ok": ok})
    return rows
