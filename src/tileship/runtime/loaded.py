"""Release: a loaded release as the runtime holds it (its operators, and what /ready and metrics report).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tileship.declare.specialization import call_dtypes
from tileship.errors import lookup

if TYPE_CHECKING:
    from tileship.runtime.dispatch import OpRunner


@dataclass
class Release:
    """A loaded release: operators by name plus everything /ready and metrics report."""

    release_id: str
    path: Any
    kernel_revision: str
    model: Mapping[str, str]
    lock: Mapping[str, Any]
    lock_digest: str
    drift: Any
    ops: dict[str, OpRunner]
    load_seconds: dict[str, float] = field(default_factory=dict)
    load_errors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    declarations: Mapping[str, Any] = field(default_factory=dict)
    evidence: Mapping[str, Any] | None = None
    #: the private snapshot the release was loaded from (``release.integrity.snapshot``); ``close`` removes it
    snapshot: Any = None
    #: what the loader made of the evidence (``release.evidence_seal.Seal``): its digest, signer, state
    evidence_seal: Any = None

    @property
    def evidence_digest(self) -> str:
        """sha256 of the evidence in effect, ``none`` without any: with the release id, what a server
        reports, so two servers of one release with different evidence are told apart."""
        return self.evidence_seal.label if self.evidence_seal is not None else "none"

    def close(self) -> None:
        """Remove the release's private snapshot (and its ``sources`` from ``sys.path``). Idempotent.
        Call it only once nothing runs on the release any more: its kernels stay mapped, but a
        reference that imports a module lazily would no longer find the shipped sources."""
        snap, self.snapshot = self.snapshot, None
        discard_snapshot(snap)

    def __post_init__(self) -> None:
        # the declared outputs, which the fast launcher allocates and ``out=`` is checked against
        for name, runner in self.ops.items():
            desc = self.declarations.get(name)
            if desc and desc.get("outputs") and not runner.shape.outputs:
                exprs = call_dtypes(desc)  # as ``loader.op_shape``: "same" with no "same" input is the one dtype
                outs = tuple((str(n), tuple(str(d) for d in dims)) for n, dims, *_ in desc["outputs"])
                out_dtypes = tuple(exprs.get(n, "same") for n, _ in outs)
                runner.shape = replace(runner.shape, outputs=outs, out_dtypes=out_dtypes)
                runner.forget()

    def op(self, name: str) -> OpRunner:
        return lookup(self.ops, name, "unknown operator", "this release")

    def decisions(self) -> dict[str, dict[str, str]]:
        """Per operator, per specialization: the path it will take and why."""
        return {name: {e.spec.id: f"{e.decision.path}:{e.decision.reason}" for e in r.entries if e.spec}
                for name, r in self.ops.items()}

    def counters(self) -> dict[str, dict[str, int]]:
        return {name: r.snapshot() for name, r in self.ops.items()}

    def telemetry(self) -> dict[str, Any]:
        """Reference calls by operator, shape and reason since load, JSON-able; the format is
        documented in ``tileship.runtime.telemetry`` (``GET /v2/tileship/telemetry`` serves it)."""
        from tileship.runtime.telemetry import SCHEMA, iso

        since = min((r.telemetry.since for r in self.ops.values()), default=0.0)
        return {"schema": SCHEMA, "release_id": self.release_id, "since": iso(since),
                "ops": {name: r.telemetry.to_json(sum(e.kernel_calls() for e in r.entries))
                        for name, r in sorted(self.ops.items())}}

    def status(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "kernel_revision": self.kernel_revision,
            "model": dict(self.model),
            "lock_digest": self.lock_digest,
            "evidence": self.evidence_seal.to_json() if self.evidence_seal is not None else None,
            "drift": self.drift.to_json(),
            "kernels": sum(1 for r in self.ops.values() for e in r.entries if e.kernel is not None),
            "reference_only": all(e.kernel is None for r in self.ops.values() for e in r.entries),
            "load_errors": dict(self.load_errors),
            "notes": list(self.notes),
        }


def discard_snapshot(snap: Any) -> None:
    """Remove the private snapshot ``snap`` a release was (or was being) loaded from, and its ``sources`` from
    ``sys.path``; None does nothing."""
    import shutil
    import sys
    from pathlib import Path

    from tileship.release import snapshot_dirs

    if snap is None:
        return
    src = str(Path(snap) / "sources")
    if src in sys.path:
        sys.path.remove(src)
    parent = Path(snap).parent
    if parent.name.startswith(snapshot_dirs.PREFIX):
        snapshot_dirs.remove(parent)
    else:
        shutil.rmtree(snap, ignore_errors=True)
