"""The demo's third step: call every specialization this machine can run and compare.

The reference's answer is held to the declaration as the dispatcher holds it (``runtime.answer``): a reference
whose answer is unlike it (a NumPy array, a tuple of the wrong length, another shape or device than declared for
the call) gives its row ``ok=False`` with the ``DeclarationError``'s words as the reason, not a traceback; so does a
``sample`` hook that raises (``making inputs failed: ...``).
"""

from __future__ import annotations

import functools
from typing import Any

from tileship.declare.inputs import sample_points
from tileship.declare.spec import tensor_tolerance
from tileship.errors import DeclarationError
from tileship.runtime.dispatch import Release
from tileship.verify.compare import disagreement
from tileship.verify.mutated import OnClones, mutated_positions
from tileship.verify.spec_check import held_at
from tileship.verify.tune_checks import inputs_failed


def _take(call: Any, decisions: list[Any], *args: Any) -> Any:
    """The output of ``call(*args)`` (``OpRunner.call``: output, decision), the decision kept in ``decisions``."""
    out, decision = call(*args)
    decisions.append(decision)
    return out


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
            if entry.decision.reason == "not_selected":  # no shape routes to it: its group's winner is exercised
                continue
            device = "cpu" if spec.target == "c" else "cuda"
            runnable = device == "cpu" or torch.cuda.is_available()
            for dims in sample_points(spec, limit=limit):
                shown = ",".join(f"{k}={v}" for k, v in dims.items())
                if not runnable:
                    rows.append({"spec_id": spec.id, "dims": shown, "path": "-",
                                 "reason": "no GPU here: " + entry.decision.reason, "err": "-", "ok": None})
                    continue
                try:
                    args = runner.sample_inputs(dims, spec.dtype, device, seed)
                except Exception as exc:  # noqa: BLE001 -- the operator's sample hook: its row fails, not the demo
                    rows.append({"spec_id": spec.id, "dims": shown, "path": "-", "err": "-", "ok": False,
                                 "reason": inputs_failed(exc)})
                    continue
                mut = mutated_positions(decl)  # inputs updated in place: compared whole, each path on clones
                decisions: list[Any] = []
                reference = held_at(name, runner.reference, decl, dims, args, dtype=None)  # on float64 inputs
                try:  # a reference that serves the call is held to the declaration by the dispatcher
                    outs = OnClones(functools.partial(_take, runner.call, decisions), mut)(*args)
                    refs = OnClones(reference, mut)(*[a.double() if torch.is_tensor(a) and a.is_floating_point()
                                                      else a for a in args])
                except DeclarationError as exc:
                    d = decisions[0] if decisions else None
                    rows.append({"spec_id": d.spec_id or spec.id if d else spec.id, "dims": shown,
                                 "path": d.path if d else "reference", "reason": exc.message, "err": "-", "ok": False})
                    continue
                d = decisions[0]
                ok, worst = True, 0.0
                names = [n for n, *_ in decl["outputs"]] + [decl["inputs"][i][0] for i in mut]
                for o_name, o, r in zip(names, outs, refs, strict=True):
                    t = tensor_tolerance(decl, o_name, spec.dtype)
                    worst = max(worst, float((o.double() - r.double()).abs().max()) if o.numel() else 0.0)
                    ok = ok and disagreement(o, r, t.atol, t.rtol) is None
                rows.append({"spec_id": d.spec_id or spec.id, "dims": shown, "path": d.path, "reason": d.reason,
                             "err": f"{worst:.2e}", "ok": ok})
    return rows

