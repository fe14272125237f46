"""Verification evidence stored with a release, and the routing rules that read it.

``evidence/verification.json`` (written by ``tileship verify``) is hashed in the manifest
but not part of the release id, so verifying never changes what a release *is*, and editing
the evidence afterwards is caught by the integrity check like any other file. Who measured it,
and whether a loader believes it, is ``evidence_seal``'s job (a verifier key's signature).

Shape of the file (``schema`` 1; every number a measurement, nothing derived at run time)::

    {"schema": 1, "release_id", "created", "lock_digest",
     "device": {name, compute_capability, sm_count, driver, cuda_runtime, torch, ...} | null,
     "host":   {machine, cpu_model, cpu_count, torch},
     "options": {seeds, reference_dtype, timing parameters, tolerance overrides},
     "specializations": {spec_id: {"device_type", "passed", "failure", "tolerance",
                                   "dynamic_dim", "route", "route_reason",
                                   "points": [{"dims", "passed", "failure", "checks", "timing"}]}}}

Routing rules (``route``, evaluated once per specialization at load):

- evidence recorded against another lock (or another release) is ignored;
- a recorded failure: ``verification_failed``, on any device (a wrong kernel stays wrong);
- no passing evidence from a matching device (GPU: name, compute capability, SM count;
  CPU: machine and CPU model): ``unverified`` for CUDA unless unverified kernels are allowed;
  CPU (``"c"``) specializations run unverified, as they always could;
- ``pinned``: the mark recorded at verification time (``route``) is final: ``kernel`` only
  where the kernel was never measurably slower than the reference at any verified point;
- ``evidence``: per shape, the faster path by the recorded medians; a difference within the
  measured noise band counts as none and keeps the kernel. For a ``T.dynamic`` range this is
  a per-size rule (``size_rule``): a bound size takes the verdict of the nearest verified
  size (log scale), evaluated by the dispatcher once per new shape, never per call.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tileship.declare.spec import Target
from tileship.errors import BundleIntegrityError
from tileship.release import evidence_shape, strict_json

EVIDENCE = "evidence/verification.json"
SCHEMA = 1
#: the fingerprint fields that must match for evidence to count on this machine
GPU_MATCH = ("name", "compute_capability", "sm_count")
HOST_MATCH = ("machine", "cpu_model")
KERNEL_FASTER, REFERENCE_FASTER, NO_DIFFERENCE = "kernel_faster", "reference_faster", "no_difference"


def read(root: Path) -> dict[str, Any] | None:
    """The evidence of the release at ``root``; None when it has none.

    Raises BundleIntegrityError (naming the file) when it is not JSON or not schema 1. Its
    hash is checked by ``bundle.check_integrity``, not here.
    """
    p = Path(root) / EVIDENCE
    if not p.exists():
        return None
    return _check(strict_json.read(p, "evidence"), p)  # never blocks on a FIFO, never reads without end


def parse(body: bytes, p: Path) -> dict[str, Any]:
    """The evidence parsed from ``body`` (the bytes a signature is checked over); ``p`` names it
    in errors. Raises BundleIntegrityError like ``read``."""
    return _check(strict_json.loads(body, p, "evidence"), p)


def _check(data: Any, p: Path) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("specializations"), dict):
        raise BundleIntegrityError(f"{p}: not tileship verification evidence (schema {SCHEMA})", path=str(p),
                                   hint="re-run `tileship verify` on the release")
    evidence_shape.check(data, p)
    return data


def write(root: Path, data: Mapping[str, Any], *, verifier_key: Path | None = None) -> dict[str, Any]:
    """Store ``data`` as the release's evidence and re-hash the release. Returns the manifest.
    ``evidence_write.write`` (its contract: signing, crash safety, the writers' lock); to change the
    evidence rather than replace it, ``evidence_write.update``."""
    from tileship.release import evidence_write

    return evidence_write.write(root, data, verifier_key=verifier_key)


# -- fingerprints ----------------------------------------------------------------

def current_device() -> dict[str, Any] | None:
    """This machine's GPU fingerprint (device 0); None without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    from tileship.build.lock import capture_environment

    p = torch.cuda.get_device_properties(0)
    gpu = capture_environment().get("gpu") or {}
    return {"name": p.name, "compute_capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
            "memory_mib": p.total_memory // (1 << 20), "l2_cache_bytes": getattr(p, "L2_cache_size", None),
            "driver": gpu.get("driver"), "cuda_runtime": torch.version.cuda, "torch": torch.__version__}


_HOST: dict[str, Any] = {}


def current_host() -> dict[str, Any]:
    """This machine's CPU fingerprint (what CPU evidence must match). Read once per process."""
    if _HOST:
        return dict(_HOST)
    import torch

    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    _HOST.update(machine=platform.machine(), cpu_model=model, cpu_count=os.cpu_count(), torch=torch.__version__)
    return dict(_HOST)


def describe_device(fp: Mapping[str, Any] | None) -> str:
    if not fp:
        return "no GPU"
    return f"{fp.get('name')} (cc {fp.get('compute_capability')}, {fp.get('sm_count')} SMs)"


def _matches(recorded: Mapping[str, Any] | None, current: Mapping[str, Any] | None, keys: tuple[str, ...]) -> bool:
    if not recorded or not current:
        return False
    return all(recorded.get(k) == current.get(k) for k in keys)


def _entry(ev: Mapping[str, Any] | None, spec_id: str, lock_digest: str,
           release_id: str | None) -> dict[str, Any] | None:
    """The spec's evidence when it was taken against this lock (and release); else None."""
    if not ev or ev.get("lock_digest") != lock_digest:
        return None
    if release_id is not None and ev.get("release_id") not in (None, release_id):
        return None
    entry = ev.get("specializations", {}).get(spec_id)
    return entry if isinstance(entry, dict) else None


def applies_here(ev: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Was ``entry`` taken on a device matching this machine's?"""
    if entry.get("device_type", "cuda") == "cpu":
        return _matches(ev.get("host"), current_host(), HOST_MATCH)
    return _matches(ev.get("device"), current_device(), GPU_MATCH)


# -- routing ---------------------------------------------------------------------

def route(ev: dict[str, Any] | None, spec_id: str, *, target: Target, routing: str, allow_unverified: bool,
          lock_digest: str, release_id: str | None = None) -> str | None:
    """The reason the reference serves ``spec_id``, or None when the kernel may run.

    For a dynamic specialization under ``evidence``, None means "for some sizes": pair it with
    ``size_rule`` for the per-size choice.
    """
    entry = _entry(ev, spec_id, lock_digest, release_id)
    if entry is not None and not entry.get("passed", False):
        return "verification_failed"
    if entry is None or not applies_here(ev, entry):  # type: ignore[arg-type]
        if target.device_type == "cpu" or allow_unverified:
            return None
        return "unverified"
    if routing == "pinned":
        return None if entry.get("route") == "kernel" else "slower_than_reference"
    verdicts = [verdict(p) for p in entry.get("points", [])]
    if verdicts and all(v == REFERENCE_FASTER for v in verdicts):
        return "slower_than_reference"
    return None


def verdict(point: Mapping[str, Any]) -> str | None:
    """``kernel_faster`` / ``reference_faster`` / ``no_difference``; None when not timed."""
    t = point.get("timing")
    return t.get("verdict") if isinstance(t, dict) else None


def compare_times(kernel_us: float, reference_us: float, noise_us: float) -> str:
    """A difference no larger than the noise band is no difference."""
    if abs(kernel_us - reference_us) <= noise_us:
        return NO_DIFFERENCE
    return KERNEL_FASTER if kernel_us < reference_us else REFERENCE_FASTER


def pinned_mark(points: Sequence[Mapping[str, Any]], passed: bool) -> tuple[str, str]:
    """(route, why) recorded at verification time for ``pinned`` routing."""
    if not passed:
        return "reference", "failed verification"
    slower = [p for p in points if verdict(p) == REFERENCE_FASTER]
    if slower:
        shown = ", ".join(_dims_text(p["dims"]) for p in slower[:4]) + (" ..." if len(slower) > 4 else "")
        return "reference", (f"reference faster beyond the noise band at {len(slower)} of {len(points)} verified "
                             f"shapes ({shown})")
    if not any(verdict(p) for p in points):
        return "kernel", "passed (not timed)"
    return "kernel", "passed; never measurably slower than the reference"


def choice_at(entry: Mapping[str, Any], dims: Mapping[str, int]) -> tuple[str, str]:
    """Under ``evidence`` routing: (path, reason) for concrete ``dims`` of a verified entry.

    Static: the recorded verdict. Dynamic: the verdict of the nearest verified size of the
    dynamic dim on a log scale (ties go to the smaller size).
    """
    points = [p for p in entry.get("points", []) if verdict(p) is not None]
    if not points:
        return "kernel", "kernel (passed, not timed)"
    dyn = entry.get("dynamic_dim")
    if dyn is None or dyn not in dims:
        nearest = points[0]
    else:
        x = math.log(max(1, int(dims[dyn])))
        nearest = min(points, key=lambda p: (abs(math.log(max(1, int(p["dims"][dyn]))) - x), int(p["dims"][dyn])))
    v = verdict(nearest)
    at = _dims_text(nearest["dims"]) if dyn is not None else "this shape"
    if v == REFERENCE_FASTER:
        return "reference", f"slower_than_reference (measured at {at})"
    return "kernel", f"kernel ({'faster' if v == KERNEL_FASTER else 'no difference'} at {at})"


class SizeRule:
    """``rule(bound_dims) -> "slower_than_reference" | None`` for one dynamic specialization;
    ``summary`` says which sizes go where (for the release status)."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.entry = entry
        dyn = entry["dynamic_dim"]
        runs: list[tuple[str, list[int]]] = []
        for p in sorted((p for p in entry.get("points", []) if verdict(p) is not None),
                        key=lambda p: int(p["dims"][dyn])):
            path = "reference" if verdict(p) == REFERENCE_FASTER else "kernel"
            if runs and runs[-1][0] == path:
                runs[-1][1].append(int(p["dims"][dyn]))
            else:
                runs.append((path, [int(p["dims"][dyn])]))
        spans = (f"{path} at {dyn}={v[0]}" + (f"..{v[-1]}" if len(v) > 1 else "") for path, v in runs)
        self.summary = "evidence per size: " + ", ".join(spans)

    def __call__(self, dims: Mapping[str, int]) -> str | None:
        return "slower_than_reference" if choice_at(self.entry, dims)[0] == "reference" else None


def size_rule(ev: dict[str, Any] | None, spec_id: str, *, routing: str, lock_digest: str,
              release_id: str | None = None) -> SizeRule | None:
    """For a dynamic specialization under ``evidence`` routing whose verified sizes disagree,
    the per-size rule for the dispatcher's slow path. None when one path wins everywhere
    (``route`` already said which), under ``pinned``, or without applicable evidence."""
    entry = _entry(ev, spec_id, lock_digest, release_id)
    if routing != "evidence" or entry is None or not entry.get("passed") or entry.get("dynamic_dim") is None:
        return None
    if not applies_here(ev, entry):  # type: ignore[arg-type]
        return None
    verdicts = {verdict(p) == REFERENCE_FASTER for p in entry.get("points", []) if verdict(p) is not None}
    return SizeRule(entry) if len(verdicts) == 2 else None


def notes(ev: Mapping[str, Any] | None, *, lock_digest: str, allow_unverified: bool, cuda: bool,
          release_id: str | None = None) -> list[str]:
    """Lines for the release status: what the evidence says and whether it applies here."""
    off = "CUDA specializations serve the reference (allow_unverified is off)"
    on = "CUDA kernels run UNVERIFIED (allow_unverified is on)"
    if ev is None:
        return [f"release has no verification evidence: {on if allow_unverified else off}"] if cuda else []
    specs = ev.get("specializations", {})
    failed = sorted(s for s, e in specs.items() if not e.get("passed"))
    out = [f"verification evidence from {ev.get('created', '?')} on {describe_device(ev.get('device'))}: "
           f"{len(specs) - len(failed)} passed, {len(failed)} failed"
           + (f" ({', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''})" if failed else "")]
    if ev.get("lock_digest") != lock_digest or (release_id is not None
                                                and ev.get("release_id") not in (None, release_id)):
        out.append("verification evidence was taken against another lock/release: it is ignored; "
                   f"{on if allow_unverified else off}" if cuda
                   else "verification evidence was taken against another lock/release: it is ignored")
    elif cuda and any(e.get("device_type", "cuda") == "cuda"
                      for e in specs.values()) and not _matches(ev.get("device"), current_device(), GPU_MATCH):
        out.append(f"verification evidence was taken on {describe_device(ev.get('device'))}, this is "
                   f"{describe_device(current_device())}: "
                   + (on if allow_unverified else off))
    return out


def _dims_text(dims: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())
