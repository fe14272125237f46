"""A Ray fleet replica loads the registry's copy of a release as a server following the registry does: expecting the
evidence pinned on activation and the release id the registry names the copy by (no Ray cluster needed here).

Before: the controller handed a replica only the copy's path, which it loaded as a release directory: evidence put
into the registry copy after activation (replayed, or added) was used, and a copy holding another release served.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tileship.errors import BundleIntegrityError
from tileship.release import bundle, evidence_seal
from tileship.release.registry import Registry
from tileship.runtime.loader import load
from tileship.serve.fleet_plan import FleetPolicy
from tileship.serve.holder import ReleaseHolder
from tileship.serve.ray_fleet import FleetController


def _loader(path: Path, reference_only: bool, evidence: str | None) -> Any:
    return load(path, trusted_keys=[], reference_only=reference_only, expect_evidence_digest=evidence)


def _assignment(reg: Registry) -> dict[str, Any]:
    """What the fleet's controller tells a replica to serve, on a registry with an active release."""
    ctl = FleetController(str(reg.root), FleetPolicy(), 1.0)
    ok, rid = ctl._active()
    assert ok and rid is not None
    ctl.plan.tick(rid, time.monotonic())
    report = {"release": None, "failed": {}, "samples": [], "node": ""}
    return asyncio.run(ctl.sync("replica-1", report))  # type: ignore[no-any-return]


def test_a_replica_expects_the_pin_and_the_id_the_registry_recorded(cpu_release: Path, tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(cpu_release)
    assert reg.activate(rid).evidence == evidence_seal.NO_EVIDENCE
    want = _assignment(reg)
    assert want["release"] == rid and want["evidence"] == evidence_seal.NO_EVIDENCE, want
    copy = Path(want["path"])
    (copy / "evidence").mkdir()  # evidence appears in the registry copy after activation
    (copy / "evidence" / "verification.json").write_text(json.dumps({"schema": 1, "specializations": {}}))
    bundle.write_manifest(copy)
    holder = ReleaseHolder(copy, _loader)
    holder.follow(copy, want["release"], want["evidence"])  # what the replica does with the assignment
    target = holder.resolve()
    assert (target.release_id, target.evidence) == (rid, evidence_seal.NO_EVIDENCE)
    served = holder.prepare(target)
    assert served.release.evidence_seal.stale, "evidence added after activation was used"
    served.release.close()
    holder.follow(copy, "0123456789abcdef", None)  # a copy holding another release than the one assigned
    with pytest.raises(BundleIntegrityError, match=f"holds release {rid}, not 0123456789abcdef"):
        holder.prepare(holder.resolve())
