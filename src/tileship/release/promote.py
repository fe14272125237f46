"""``tileship promote``'s steps: build -> verify -> tune -> publish -> activate (directly, or
through a canary in a running server).

Each step is a function returning a value; ``tileship.cli.promote_cmd`` strings them together
and prints. ``canary`` talks to a running ``tileship serve`` over HTTP
(``POST /v2/tileship/canary``, then ``GET`` until the server has promoted or rolled back on
its own, see ``tileship.serve.rollout``) and hands every new decision to ``on_decision`` as it
appears. Nothing here imports torch or TileLang at module level.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship.errors import TileshipError, VerificationError

TERMINAL = ("promoted", "rolled_back", "aborted", "failed")


@dataclass(frozen=True)
class CanaryOutcome:
    """How a canary ended: ``state`` is one of TERMINAL (or ``timeout``), with the server's last status."""

    state: str
    status: dict[str, Any]
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def promoted(self) -> bool:
        return self.state == "promoted"


def build(project: Path | None, out: Path, *, jobs: int) -> Path:
    """Build the project (default: search from cwd, else the built-in catalog) into ``out``; the
    release directory. Raises TileshipError when any specialization failed to build."""
    from tileship.build.builder import BuildOptions
    from tileship.build.builder import build as do_build
    from tileship.declare.project import find_project, load_operators

    proj = find_project(project)
    result = do_build(proj, load_operators(proj), out, BuildOptions(jobs=jobs))
    if result.failed:
        raise TileshipError(f"{len(result.failed)} specializations failed to build ({result.failed[0].spec.id}: "
                            f"{(result.failed[0].error or '')[:200]})", hint=f"see {result.path / 'build-log.json'}")
    return Path(result.path)


def verify(path: Path, *, budget_ms: float = 100.0) -> dict[str, Any]:
    """Verify the release on this machine (evidence written into it); a summary. Raises
    VerificationError when a specialization failed: a release that failed is not promoted."""
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify as do_verify

    result = do_verify(path, VerifyOptions(seeds=(0, 1), budget_ms=budget_ms, warmup_ms=min(25.0, budget_ms)))
    if result.failed:
        v = result.failed[0]
        raise VerificationError(f"{len(result.failed)} specializations failed verification ({v.spec.id}: {v.failure})",
                                hint="fix the kernel (or --no-verify to skip this step, not recommended)")
    return {"verified": len(result.verdicts), "skipped": len(result.skipped)}


def tune(path: Path, *, budget_ms: float = 40.0) -> dict[str, Any]:
    """Tune the release on this machine (``tileship.verify.tune``); a summary. Raises
    TileshipError when the tune module is not installed or nothing can be tuned here, VerificationError
    (after the evidence is stored) when tune could not check a group's reference (a release whose reference
    breaks its declaration is not promoted) or a candidate's artifact did not load (as ``tileship tune`` exits 2)."""
    from tileship.release import tuning

    try:
        from tileship.verify.tune import TuneOptions, tune_release
    except ImportError as exc:
        raise TileshipError(f"the tune step needs tileship.verify.tune, which is not available ({exc})",
                            hint="skip it with --no-tune") from None
    data = tune_release(path, TuneOptions(budget_ms=budget_ms, warmup_ms=min(10.0, budget_ms)))
    if failed := tuning.failures(data.get("tuning")):
        gid, first = sorted(failed.items())[0]
        raise VerificationError(f"tune could not check the reference of {len(failed)} groups ({gid}: "
                                f"{tuning.describe_failure(first)})",
                                hint="fix the operator's reference (`tileship explain` names the failure)")
    unloaded = {f"{gid}/{cid}": why for gid, g in (data.get("tuning") or {}).items()
                for cid, why in tuning.unloaded(g).items()}
    if unloaded:
        cand, why = sorted(unloaded.items())[0]
        raise VerificationError(f"{len(unloaded)} candidates did not load ({cand}: {why})",
                                hint="rebuild the release: its artifacts must load where it serves")
    points = [p for g in data.get("tuning", {}).values() for p in g.get("points", [])]
    return {"groups": len(data.get("tuning", {})), "buckets": len(points),
            "kernel_wins": sum(1 for p in points if p.get("winner"))}


def publish(registry: Path | None, path: Path) -> tuple[Any, str]:
    """(Registry, release id) after publishing ``path`` (a newer copy replaces one with other evidence).
    Raises RegistryError when the registry would refuse to activate it (failed verification), so
    that no canary is started for a release that could not be promoted."""
    from tileship.errors import RegistryError
    from tileship.release.registry import Registry, verification_status

    reg = Registry(registry)
    rid = reg.publish(path, replace=True)
    status, detail = verification_status(reg.path_of(rid))
    if status in ("failed", "unreadable"):
        raise RegistryError(f"{rid} would not be activated: verification {status}: {detail}",
                            hint="fix the failing specializations and build again")
    return reg, rid


def canary(server: str, release: str, policy: dict[str, Any], *, timeout_s: float = 600.0, poll_s: float = 0.25,
           on_decision: Callable[[dict[str, Any]], None] | None = None) -> CanaryOutcome:
    """Start a canary of ``release`` (a release directory or an id in the server's registry) on
    the server at ``server`` and wait until it is promoted or rolled back. Raises TileshipError
    when the server refuses to start it (it says why: load failure, one already running)."""
    import httpx

    url = server.rstrip("/") + "/v2/tileship/canary"
    try:
        r = httpx.post(url, json={"release": release, **policy}, timeout=max(60.0, timeout_s))
    except httpx.HTTPError as exc:
        raise TileshipError(f"cannot reach the server at {server}: {exc}",
                            hint="start it with `tileship serve REGISTRY --port PORT`") from None
    body = _json(r)
    if r.status_code != 200:
        raise TileshipError(f"the server refused the canary ({r.status_code}, stage {body.get('stage', '-')}): "
                            f"{body.get('error', r.text[:300])}", hint=body.get("hint"))
    seen = 0
    deadline = time.monotonic() + timeout_s
    status = body
    while True:
        decisions = status.get("decisions", [])
        for d in decisions[seen:]:
            if on_decision is not None:
                on_decision(d)
        seen = max(seen, len(decisions))
        if status.get("state") in TERMINAL:
            return CanaryOutcome(status["state"], status, decisions)
        if time.monotonic() > deadline:
            return CanaryOutcome("timeout", status, decisions)
        time.sleep(poll_s)
        try:
            status = _json(httpx.get(url, timeout=30.0))
        except httpx.HTTPError as exc:
            raise TileshipError(f"lost the server at {server} during the canary: {exc}") from None


def _json(r: Any) -> dict[str, Any]:
    try:
        doc = r.json()
    except ValueError:
        return {"error": r.text[:300]}
    return doc if isinstance(doc, dict) else {"error": str(doc)[:300]}
