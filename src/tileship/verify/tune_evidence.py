"""The evidence a ``tileship tune`` stores: what it measured merged into the release's evidence.

``merge`` is called with the evidence as it is when the tune writes (``evidence_write.update``, under
the release's writer lock), not as it was when the tune began: a ``verify`` or another ``tune`` that
stored evidence while this one measured keeps what it stored. Earlier evidence is kept only where it
still describes this release here (same lock digest and release, this machine's device and host)
and, when the tune signs, only when it is signed by that key or a trusted verifier key (a signature
must not vouch for entries it did not measure). ``failed_group`` is the table of a group tune could not measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tileship.declare.spec import Specialization
from tileship.release import bundle, evidence_seal
from tileship.release import evidence as ev_mod
from tileship.verify.latency import PROBE_CALLS, HostGauge
from tileship.verify.timing import NOISE_FLOOR
from tileship.verify.tune_options import TuneOptions


def keeps(old: Mapping[str, Any], root: Path, release_id: str, digest: str, *, cuda: bool,
          verifier_key: Path | None) -> bool:
    """Whether the release's earlier evidence ``old`` is kept beside a tune's (else it describes
    another lock, release or machine, or a signing tune could not vouch for it)."""
    same_device = ev_mod.applies_here(old, {"device_type": "cuda"}) if cuda else old.get("device") is None
    keep = (
        old.get("lock_digest") == digest
        and old.get("release_id") in (None, release_id)
        and same_device
        and ev_mod.applies_here(old, {"device_type": "cpu"})
    )
    if verifier_key is not None and keep and old:
        vouch = [bundle.load_private_key(verifier_key).public_key(), *evidence_seal.trusted(None)]
        keep = evidence_seal.check_dir(root, vouch).state == evidence_seal.VERIFIED
    return keep


def merge(old: Mapping[str, Any] | None, *, root: Path, release_id: str, digest: str, cuda: bool,
          verifier_key: Path | None, groups: Mapping[str, Any], verdicts: Mapping[str, Any],
          options: TuneOptions, gauge: HostGauge | None) -> dict[str, Any]:
    """The evidence to store: ``old`` (the release's evidence now; None: none) where ``keeps`` it, with
    this tune's ``groups`` (group id -> table) and candidates' ``verdicts`` (spec id -> verification
    entry) put over it, and this tune's options, lock digest and fingerprints."""
    old = old or {}
    keep = keeps(old, root, release_id, digest, cuda=cuda, verifier_key=verifier_key)
    specs_ev: dict[str, Any] = {**((old.get("specializations") or {}) if keep else {}), **verdicts}
    table: dict[str, Any] = {**((old.get("tuning") or {}) if keep else {}), **groups}
    data = {
        **(old if keep else {}),
        "schema": ev_mod.SCHEMA,
        "release_id": release_id,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lock_digest": digest,
        "device": ev_mod.current_device(),
        "host": ev_mod.current_host(),
        "specializations": dict(sorted(specs_ev.items())),
        "tuning": dict(sorted(table.items())),
        "tuning_options": {
            "seeds": list(options.seeds),
            "budget_ms": options.budget_ms,
            "warmup_ms": options.warmup_ms,
            "rounds": options.rounds,
            "confirm_rounds": options.confirm_rounds,
            "flush": options.flush,
            "clock": options.clock,
            "host_gauge": None if gauge is None else {"probe_calls": PROBE_CALLS, "fastest_probe_us": gauge.best_us},
            "prune": options.prune,
            "limit": options.limit,
            "noise_floor": NOISE_FLOOR,
            "buckets": {k: list(v) for k, v in options.buckets.items()},
        },
    }
    data.setdefault("options", {"seeds": list(options.seeds), "timing": False, "source": "tune"})
    return data


def failed_group(spec: Specialization, specs: Sequence[Specialization], dims: Mapping[str, int],
                 reason: str) -> dict[str, Any]:
    """The table of a group (first specialization ``spec``; its candidates' ``specs`` in declaration order) whose
    reference could not be checked at ``dims``: no point, and ``failed`` naming the point and ``reason``
    (``tuning.failure``). The loader serves the reference for every shape of it; nothing was verified or timed."""
    return {
        "op": spec.op,
        "dtype": spec.dtype,
        "target": spec.target,
        "dynamic_dim": spec.dynamic_dim,
        "candidates": [s.candidate or "default" for s in specs],
        "points": [],
        "failed": {"dims": {k: int(v) for k, v in dims.items()}, "reason": reason},
    }


__all__ = ["failed_group", "keeps", "merge"]
