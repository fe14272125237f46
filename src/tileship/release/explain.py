"""``tileship explain RELEASE OP DIMS``: the routing decision of one shape, from the files alone.

Reads ``release.json``, the lock and the evidence file; loads nothing, needs no GPU. The decision
is the one the loader makes on the device the evidence was taken on (the loader also refuses
evidence from another device; that check needs the device and is not made here):

- a tuned group (``tileship tune``): the bucket holding the size, every candidate's time or
  failure there, the reference's, the noise band and the winner; a group tune could not check the
  reference of: where and why, and that the reference keeps it;
- an untuned one: the first declared candidate under verification routing (``pinned``: the mark
  recorded by verify; ``evidence``: the verdict of the nearest verified size), with its numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.build.lock import lock_digest, read_lock
from tileship.declare.spec import Specialization
from tileship.release import described, tuning
from tileship.release import evidence as ev_mod


def _covers(spec: Specialization, dims: Mapping[str, int]) -> bool:
    for d, v in spec.dims:
        if d not in dims:
            return False
        if isinstance(v, tuple):
            if not v[0] <= dims[d] <= v[1]:
                return False
        elif dims[d] != v:
            return False
    return True


def explain(root: Path | str, op: str, dims: Mapping[str, int], *, dtype: str | None = None) -> tuple[list[str], bool]:
    """(lines, whether any specialization covers the shape). Raises BundleIntegrityError for an
    unreadable evidence file; an unknown operator or dim is a line, not an exception."""
    root = Path(root)
    rel = described.read(root / "release.json")
    if op not in rel["operators"]:
        return [f"operator {op!r} is not in this release (it has: {', '.join(sorted(rel['operators']))})"], False
    lock = read_lock(root / "tileship.lock")
    ev = ev_mod.read(root)
    digest = lock_digest(lock)
    bound = ev is not None and ev.get("lock_digest") == digest
    policy = rel.get("policy", {}).get("routing", "pinned")
    lines = [f"release {rel.get('release_id', root.name)}: {op} at " + ", ".join(f"{k}={v}" for k, v in dims.items())]
    if ev is None:
        lines.append('no evidence: CUDA kernels serve only with allow_unverified; "c" kernels serve unverified')
    elif not bound:
        lines.append("the evidence was taken against another lock: the loader ignores it")
    else:
        lines.append(
            f"evidence from {ev.get('created', '?')} on {ev_mod.describe_device(ev.get('device'))}"
            f"; routing policy {policy}"
        )
    table = tuning.table(ev, lock_digest=digest) if bound else {}
    raw_tuning = (ev or {}).get("tuning", {}) if bound else {}
    groups: dict[str, list[Specialization]] = {}
    for info in rel["specializations"].values():
        spec = Specialization.from_json(info["spec"])
        if spec.op == op and (dtype is None or spec.dtype == dtype) and _covers(spec, dims):
            groups.setdefault(spec.group_id, []).append(spec)
    if not groups:
        declared = sorted(
            {d for info in rel["specializations"].values() for d, _ in info["spec"]["dims"] if info["spec"]["op"] == op}
        )
        lines.append(
            f"no specialization covers this shape (dims {', '.join(declared)}): the reference serves it, "
            "reason undeclared_shape"
        )
        return lines, False
    for gid, specs in sorted(groups.items()):
        lines.append(f"group {gid} ({len(specs)} candidate{'s' if len(specs) != 1 else ''})")
        group = raw_tuning.get(gid)
        if group is not None:
            if gid not in table:
                lines.append("  tuned on another device than this one: the loader here would ignore it")
            if (failed := tuning.failure(group)) is not None:
                lines.append(f"  tune FAILED: {tuning.describe_failure(failed)}")
                lines.append(f"  decision: reference kept ({tuning.TUNING_FAILED}): tune could not check this "
                             "group's reference, so nothing of it was measured and no kernel serves it")
                continue
            p = tuning.point_for(group, dims)
            if p is None:
                lines.append("  no tuned bucket holds this size: the reference serves it")
                continue
            first, last = p["bucket"]
            dyn = group.get("dynamic_dim")
            where = f"bucket {dyn}={first}..{last}, measured at {dyn}={p['dims'][dyn]}" if dyn else "this shape"
            lines.append(f"  tuned ({where}):")
            lines.extend(tuning.describe_point(group, p))
            continue
        order = [c["id"] for c in rel["operators"][op].get("candidates") or []]
        specs.sort(key=lambda sp: order.index(sp.candidate) if sp.candidate in order else -1)
        lines.extend(_untuned(ev if bound else None, specs, dims, policy))
    return lines, True


def _untuned(
    ev: Mapping[str, Any] | None, specs: list[Specialization], dims: Mapping[str, int], policy: str
) -> list[str]:
    spec = specs[0]  # in declaration order: the candidate the loader serves untuned
    out = [f"  not tuned: {spec.id} serves (the first candidate)" if len(specs) > 1 else f"  not tuned: {spec.id}"]
    entry = (ev or {}).get("specializations", {}).get(spec.id)
    if entry is None:
        out.append("  no verification evidence for it")
        return out
    if not entry.get("passed"):
        out.append(f"  verification FAILED: {entry.get('failure')} -> reference (verification_failed)")
        return out
    if policy == "pinned":
        out.append(f"  pinned mark: {entry.get('route')} ({entry.get('route_reason')})")
        return out
    path, why = ev_mod.choice_at(entry, dims)
    out.append(f"  evidence routing: {path} ({why})")
    for p in entry.get("points", []):
        t = p.get("timing") or {}
        if t:
            at = ",".join(f"{k}={v}" for k, v in p["dims"].items())
            out.append(
                f"    at {at}: kernel {t['kernel']['median_us']:.2f} us, "
                f"reference {t['reference']['median_us']:.2f} us, "
                f"noise {t.get('noise_us') or 0:.2f} us -> {t.get('verdict')}"
            )
    return out
