"""Registry records: the active pointer, a stored release as listed, and its verification status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Active:
    """What a server should serve. ``release_id`` is None when nothing was ever activated.

    ``reference_only``: serve that release's operators through their PyTorch references
    only (no native code is loaded). ``previous``: the release ``rollback`` would return to.
    """

    release_id: str | None
    path: Path | None
    reference_only: bool
    previous: str | None


@dataclass(frozen=True)
class ReleaseInfo:
    """One published release as ``releases()`` lists it."""

    release_id: str
    path: Path
    model: str
    kernel_revision: str
    verification: str  # passed | failed | unverified | unreadable
    verification_detail: str
    integrity_ok: bool
    integrity_error: str | None
    active: bool
    reference_only: bool
    published_at: float


def verification_status(root: Path) -> tuple[str, str]:
    """(status, detail) from ``evidence/verification.json``.

    ``unverified`` when there is no evidence; ``failed`` when any specialization failed
    (the detail names them); ``unreadable`` when the file is not valid JSON.
    """
    p = Path(root) / "evidence" / "verification.json"
    if not p.exists():
        return "unverified", "no evidence/verification.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        return "unreadable", f"{p}: {exc}"
    specs = data.get("specializations") if isinstance(data, dict) else None
    if not isinstance(specs, dict):
        return "unreadable", f"{p}: no 'specializations' mapping"
    failed = sorted(sid for sid, e in specs.items() if not (isinstance(e, dict) and e.get("passed", False)))
    if failed:
        return "failed", f"{len(failed)} of {len(specs)} specializations failed verification: {', '.join(failed[:5])}" + (" ..." if len(failed) > 5 else "")
    device = (data.get("device") or {}).get("name", "?")
    return "passed", f"{len(specs)} specializations passed on {device}"
