"""Verification evidence stored with a release, and the routing rules that read it.

``evidence/verification.json`` (written by ``tileship verify``) is hashed in the manifest
but not part of the release id. Routing rules (``route``):

- no evidence for a CUDA specialization: ``unverified`` unless unverified kernels are allowed;
  CPU (``"c"``) specializations run unverified (no GPU evidence can exist for them);
- evidence from another device (name / compute capability) or another lock: ``unverified``;
- evidence that failed: ``verification_failed``;
- ``pinned``: the choice recorded at verification time (``route``) is final;
- ``evidence``: the faster path by the recorded medians; a difference within the measured
  spread counts as none and keeps the kernel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import BundleIntegrityError
from .spec import Target

EVIDENCE = "evidence/verification.json"


def read(root: Path) -> dict[str, Any] | None:
    p = Path(root) / EVIDENCE
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise BundleIntegrityError(f"{p}: evidence is not valid JSON ({exc})", path=str(p)) from None
    return data if isinstance(data, dict) else None


def current_device() -> dict[str, Any] | None:
    """The fingerprint fields evidence must match (None without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "compute_capability": f"{p.major}.{p.minor}"}


def route(ev: dict[str, Any] | None, spec_id: str, *, target: Target, routing: str, allow_unverified: bool,
          lock_digest: str) -> str | None:
    """The reason the reference serves ``spec_id``, or None when the kernel may run."""
    entry = (ev or {}).get("specializations", {}).get(spec_id)
    if entry is None:
        if target.device_type == "cpu" or allow_unverified:
            return None
        return "unverified"
    if target.device_type == "cuda":
        dev = current_device()
        fp = ev.get("device", {}) if ev else {}
        if dev is None or fp.get("name") != dev["name"] or fp.get("compute_capability") != dev["compute_capability"] \
                or ev.get("lock_digest") != lock_digest:  # type: ignore[union-attr]
            return None if allow_unverified else "unverified"
    if not entry.get("passed", False):
        return "verification_failed"
    if routing == "pinned":
        return None if entry.get("route", "kernel") == "kernel" else "slower_than_reference"
    k, r, spread = entry.get("kernel_us"), entry.get("reference_us"), entry.get("spread_us", 0.0)
    if k is not None and r is not None and k - r > spread:
        return "slower_than_reference"
    return None
