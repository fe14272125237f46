"""Verification results: per point, per specialization and per release; values, not exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship.declare.spec import Specialization, Tolerance
from tileship.release import evidence as ev_mod
from tileship.verify.compare import Check
from tileship.verify.timing import Timing, _num

# -- results (values, not exceptions) ------------------------------------------------


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
        return {"dims": dict(self.dims), "passed": self.passed, "failure": self.failure,
                "poison_confirmed": self.poison_confirmed,
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
        return {"op": self.spec.op, "dtype": self.spec.dtype, "target": self.spec.target,
                "device_type": self.device_type,
                "dynamic_dim": self.spec.dynamic_dim, "passed": self.passed, "failure": self.failure,
                "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                              "overridden": self.tolerance_overridden},
                "reference_dtype": self.reference_dtype, "route": route, "route_reason": why, "points": points}


@dataclass(frozen=True)
class VerifyResult:
    release_id: str
    path: Path
    verdicts: tuple[SpecVerdict, ...]
    #: spec id -> why it was not verified here (no GPU, build failed, filtered out)
    skipped: Mapping[str, str]
    #: the evidence stored (this run's merged into the release's, ``verify_evidence``)
    evidence: Mapping[str, Any]
    #: what of the stored evidence was replaced or dropped, one line each (``verify_evidence.merge``)
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> list[SpecVerdict]:
        return [v for v in self.verdicts if not v.passed]

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and not self.failed


# -- correctness ---------------------------------------------------------------------


# -- inputs and shapes -----------------------------------------------------------------


# -- timing ----------------------------------------------------------------------------
