"""The evidence a ``tileship verify`` stores: what it verified merged into the release's evidence.

``merge`` is called with the evidence as it is when verify writes (``evidence_write.update``, under the
release's writer lock). What this run verified replaces those specializations' entries; every other
entry (operators not selected with ``--only``, specializations this machine did not run, candidates a
``tileship tune`` verified) is kept, and so is the tune table (``tuning``, ``tuning_options``): a partial or
repeated verify loses nothing. Earlier evidence is kept only where ``tune_evidence.keeps`` keeps it (same lock
digest and release, this machine's device and host, and, when verify signs, signed by that key or a trusted
verifier key); otherwise it is replaced as a whole and a note says why.

A tune group whose bucket winner (a candidate the loader routes a bucket to) this run failed is dropped from
the table, with a note naming the group, the candidate and the failure: the group then serves as an untuned one
(verification routing, which serves the reference for the failed specialization) until ``tileship tune`` runs again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.release import evidence as ev_mod
from tileship.release import tuning
from tileship.verify.tune_evidence import keeps


def _why_replaced(old: Mapping[str, Any], release_id: str, digest: str, cuda: bool) -> str:
    """Why ``old`` (not kept by ``keeps``) does not describe this release here, in words."""
    if old.get("lock_digest") != digest:
        return f"another lock ({old.get('lock_digest')})"
    if old.get("release_id") not in (None, release_id):
        return f"another release ({old.get('release_id')})"
    same_device = ev_mod.applies_here(old, {"device_type": "cuda"}) if cuda else old.get("device") is None
    if not same_device or not ev_mod.applies_here(old, {"device_type": "cpu"}):
        return f"another device ({ev_mod.describe_device(old.get('device'))}, host {old.get('host')})"
    return "a signature this verifier key cannot vouch for (not signed by it or a trusted verifier key)"


def _drop_tuned(table: dict[str, Any], new_specs: Mapping[str, Any], members: Mapping[str, tuple[str, str]],
                notes: list[str]) -> dict[str, Any]:
    """``table`` without the groups whose bucket winner failed this run (a note for each); ``members``: spec id ->
    (group id, candidate id)."""
    out = dict(table)
    for gid, group in table.items():
        if not isinstance(group, Mapping):
            continue
        won = set(tuning.winners(group))
        for sid, entry in sorted(new_specs.items()):
            in_group, cid = members.get(sid, ("", ""))
            if in_group == gid and cid in won and not entry.get("passed"):
                notes.append(f"tune table of {gid} dropped: verify failed {cid} ({sid}), which it routes buckets to: "
                             f"{entry.get('failure')}; the group serves untuned (verification routing) until "
                             "`tileship tune` runs again")
                del out[gid]
                break
    return out


def merge(old: Mapping[str, Any] | None, new: Mapping[str, Any], *, root: Path, cuda: bool,
          verifier_key: Path | None, members: Mapping[str, tuple[str, str]], notes: list[str]) -> dict[str, Any]:
    """The evidence to store: this run's ``new`` (whole evidence of what it verified) put over ``old`` (the
    release's evidence now; None: none) where ``keeps`` keeps it. ``members``: spec id -> (group id, candidate id)
    of the release's specializations (``Specialization.group_id``; ``default`` without candidates).
    Appends to ``notes`` a line when ``old`` was replaced as a whole and one per dropped tune group."""
    if not old:
        return dict(new)
    release_id, digest = new["release_id"], new["lock_digest"]
    if not keeps(old, root, release_id, digest, cuda=cuda, verifier_key=verifier_key):
        why = _why_replaced(old, release_id, digest, cuda)
        notes.append(f"the stored evidence was for {why}: replaced by this run's "
                     f"(its {len(old.get('specializations') or {})} specialization entries"
                     + (" and tune table" if old.get("tuning") else "") + " do not describe this release here)")
        return dict(new)
    ran = dict(new["specializations"])
    specs = {**(old.get("specializations") or {}), **ran}
    skipped = {sid: why for sid, why in {**(old.get("skipped") or {}), **new["skipped"]}.items() if sid not in specs}
    ran_ops = {e.get("op") for e in ran.values()}
    roof_skipped = {op: why for op, why in (old.get("roofline_skipped") or {}).items() if op not in ran_ops}
    roof_skipped.update(new.get("roofline_skipped") or {})
    data = {**old, **new, "specializations": dict(sorted(specs.items())), "skipped": dict(sorted(skipped.items()))}
    data.pop("roofline_skipped", None)
    if roof_skipped:
        data["roofline_skipped"] = dict(sorted(roof_skipped.items()))
    if old.get("ceilings") or new.get("ceilings"):
        data["ceilings"] = {**(old.get("ceilings") or {}), **(new.get("ceilings") or {})}
    if isinstance(old.get("tuning"), dict):
        data["tuning"] = _drop_tuned(old["tuning"], ran, members, notes)
    return data


__all__ = ["merge"]
