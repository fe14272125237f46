"""Load a release into this process without compiling anything.

Order: integrity (``release.integrity.snapshot``: every file hashed while it is copied into a
private 0700 snapshot, the signature when keys are trusted, over the bytes the manifest is
parsed from) -> everything below reads the snapshot, never the bundle again -> lock vs
running environment -> import the references -> load each specialization for this device
from the bundle alone (never TileLang's cache dir, never nvcc, never a writable bundle)
-> routing from verification evidence. The no-JIT guard is installed first, so any path
that would compile raises instead (and is counted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship import env
from tileship.build.lock import capture_environment, compare, lock_digest, read_lock
from tileship.declare.spec import Specialization, Target
from tileship.declare.specialization import call_dtypes
from tileship.errors import ArtifactLoadError, BundleIntegrityError, LockMismatch, TileshipError
from tileship.release import evidence, evidence_seal, integrity, tuning
from tileship.runtime import native
from tileship.runtime.dispatch import KERNEL, REFERENCE, Decision, Entry, OpRunner, OpShape, Release
from tileship.runtime.loaded import discard_snapshot
from tileship.runtime.references import import_references, import_sample, use_sources

_log = logging.getLogger("tileship.load")


def load_artifact(spec_dir: Path, spec_id: str) -> Any:
    """dlopen one specialization from its bundle directory through its runtime (``runtime.artifact``:
    ctypes for the "c" target, the tvm-ffi runtime module for CUDA), never through TileLang's
    Python, whose import brings its compilers in. Raises ArtifactLoadError naming the specialization."""
    from tileship.runtime import artifact

    return artifact.load(spec_dir, spec_id)


def _device_state() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    caps = [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())] if cuda else []
    # every visible device: a specialization loads when one of them can run it; the dispatcher sends
    # tensors on a device of another capability to the reference (runtime.route.capability_matches)
    return {"cuda": cuda, "capability": caps[0] if caps else None, "capabilities": caps}


def load(path: Path | str, *, trusted_keys: Iterable[Path] | None = None, drift_policy: str | None = None,
         allow_unverified: bool | None = None, routing: str | None = None, forbid_compile: bool = True,
         disabled: Iterable[str] = (), reference_only: bool = False, allow_reference_drift: bool | None = None,
         trusted_verifier_keys: Iterable[Path] | None = None, expect_evidence_digest: str | None = None) -> Release:
    """Load the release at ``path``. Never compiles.

    Raises BundleIntegrityError / SignatureError (names the file) before anything is loaded;
    LockMismatch on blocking drift when the drift policy is ``strict``; ReferenceDrift (naming the
    operator and module) under any policy when a reference module differs from the one the release
    pinned, unless ``allow_reference_drift`` (default: ``TILESHIP_ALLOW_REFERENCE_DRIFT``; then it is
    a note). ``trusted_verifier_keys`` (default: ``TILESHIP_TRUSTED_VERIFIER_KEYS``): when any are
    trusted, evidence not signed by one of them for this release is ignored, with a note, and the
    release serves as unverified (``Release.evidence_seal``). ``expect_evidence_digest``: the evidence
    pin (the sha256 ``GET /v2`` reports as ``evidence_digest``, or ``"none"`` for a release without
    evidence; a registry records it on activation and passes it when a server loads the active
    release): evidence that is not that one is ignored (``Seal.stale``, the reason names both
    digests) and every specialization serves the reference; None (default): not checked. ``reference_only``
    loads nothing native: every specialization serves the reference (``disabled_by_policy``),
    the last line of defence. Every other problem
    (drift under ``fallback``, an artifact that fails to load, a device not covered) is a
    value: the affected specializations serve the reference and say why. An error names the release's file,
    never the private snapshot it was read from; a load that fails removes its snapshot at once.
    """
    root = Path(path)
    t0 = time.perf_counter()
    checked = integrity.snapshot(root, trusted_keys=trusted_keys)
    try:
        return _load_checked(root, checked, t0, drift_policy=drift_policy, allow_unverified=allow_unverified,
                             routing=routing, forbid_compile=forbid_compile, disabled=disabled,
                             reference_only=reference_only, allow_reference_drift=allow_reference_drift,
                             trusted_verifier_keys=trusted_verifier_keys,
                             expect_evidence_digest=expect_evidence_digest)
    except BaseException as exc:
        # a server retrying a bad release must not keep a full copy of it per attempt until it exits
        discard_snapshot(checked.snapshot)
        if isinstance(exc, TileshipError) and checked.snapshot is not None:
            _name_release_files(exc, checked.snapshot, checked.root)
        raise


def _name_release_files(exc: TileshipError, snap: Path, root: Path) -> None:
    """``exc`` (raised while reading the snapshot ``snap``) made to name ``root``'s files instead (in place)."""
    old, new = str(snap), str(root)
    if old in exc.message:
        exc.message = exc.message.replace(old, new)
        exc.args = (exc.message, *exc.args[1:])
    where = getattr(exc, "path", None)
    if isinstance(where, str) and old in where:
        exc.path = where.replace(old, new)  # type: ignore[attr-defined]


def _load_checked(root: Path, checked: integrity.Checked, t0: float, *, drift_policy: str | None,
                  allow_unverified: bool | None, routing: str | None, forbid_compile: bool, disabled: Iterable[str],
                  reference_only: bool, allow_reference_drift: bool | None,
                  trusted_verifier_keys: Iterable[Path] | None, expect_evidence_digest: str | None) -> Release:
    """``load`` of the release ``checked`` (its snapshot read, never the bundle again)."""
    manifest, snap = checked.manifest, checked.snapshot
    assert snap is not None
    for required in ("release.json", "tileship.lock"):  # read next: missing is no release, not a crash or "run lock"
        if required not in manifest["files"]:
            raise BundleIntegrityError(f"{snap / required}: missing: every release holds one (written by "
                                       f"`tileship build`)", path=str(snap / required), hint="rebuild the release")
    for warning in checked.warnings:
        _log.info("%s: %s", root, warning)  # also in the release's notes (status, /v2/health/ready)
    rel, groups, shapes = _described(snap / "release.json")
    lock = read_lock(snap / "tileship.lock")
    policy = dict(rel.get("policy", {}))
    drift_policy = drift_policy or policy.get("drift", "fallback")
    routing = routing or policy.get("routing", "pinned")
    if allow_unverified is None:
        allow_unverified = env.allow_unverified()
    if allow_unverified is None:
        allow_unverified = bool(policy.get("allow_unverified", False))
    report = compare(lock, capture_environment())
    if report.blocking and drift_policy == "strict":
        raise LockMismatch("blocking drift against the release lock: " + report.reason, report=report,
                           hint="run `tileship check` for details; rebuild for this environment or use drift=fallback")
    env.ensure_tilelang_cache_dir()
    if forbid_compile:
        from tileship.runtime import nojit

        nojit.install()
    device = _device_state()
    ev, seal = evidence_seal.open_evidence(snap, manifest["release_id"], manifest["files"], trusted_verifier_keys,
                                           expect=expect_evidence_digest)
    notes: list[str] = list(checked.warnings)
    if (line := evidence_seal.note(seal, cuda=device["cuda"], allow_unverified=allow_unverified)) is not None:
        notes.append(line)
    if seal.signer is not None and seal.signer == checked.key_id:
        notes.append(f"the evidence is signed with the build key {seal.signer}: use a separate verifier key")
    if reference_only:
        notes.append("reference-only: every operator serves the PyTorch reference by policy")
    if report.blocking:
        notes.append(f"blocking drift ({report.reason}): every operator serves the reference")
    disabled = set(disabled)
    load_seconds: dict[str, float] = {}
    load_errors: dict[str, str] = {}
    ops: dict[str, OpRunner] = {}
    use_sources(snap)
    allow_drift = env.allow_reference_drift() if allow_reference_drift is None else allow_reference_drift
    references, drift_notes = import_references(rel["operators"], lock, snap / "sources", allow_drift=allow_drift)
    notes.extend(drift_notes)
    tuned = tuning.table(ev, lock_digest=lock_digest(lock), release_id=manifest["release_id"])
    ctx = _Context(snap, report.blocking, reference_only, disabled, device, load_seconds, load_errors, seal.stale)
    by_op: dict[str, dict[str, Any]] = {}
    for gid, members in groups.items():
        by_op.setdefault(members[0][2].op, {})[gid] = members
    for name, desc in sorted(rel["operators"].items()):
        reference = references[name]
        entries: list[Entry] = []
        for gid, members in by_op.get(name, {}).items():
            group = tuned.get(gid)
            if group is not None:
                entries.extend(_tuned_entries(ctx, members, group))
                continue
            # untuned: the first declared candidate (the only one without candidates) under verification routing
            sid, info, spec = members[0]
            reason, kernel = _prepare(ctx, sid, info, spec)
            if reason is None:
                reason = evidence.route(ev, sid, target=Target(spec.target), routing=routing,
                                        allow_unverified=allow_unverified, lock_digest=lock_digest(lock),
                                        release_id=manifest["release_id"])
            if reason is None:
                rule = evidence.size_rule(ev, sid, routing=routing, lock_digest=lock_digest(lock),
                                          release_id=manifest["release_id"])
                entries.append(Entry(spec, kernel, Decision(KERNEL, KERNEL, sid),
                                     detail=rule.summary if rule else "", choose=rule))
            else:
                entries.append(Entry(spec, None, Decision(REFERENCE, reason, sid)))
            entries.extend(Entry(s, None, Decision(REFERENCE, tuning.NOT_SELECTED, i),
                                 detail="not tuned: the first declared candidate serves") for i, _, s in members[1:])
        device_reasons = {"cuda": "device_not_covered", "cpu": "device_not_covered"}
        ops[name] = OpRunner(shapes[name], reference, entries, device_reasons=device_reasons)
        ops[name].sample = import_sample(desc, name)
    if (line := native.attach(snap, ops)) is not None:
        notes.append(line)
    if seal.state != evidence_seal.IGNORED:  # else the seal's note already says what serves
        notes.extend(evidence.notes(ev, lock_digest=lock_digest(lock), allow_unverified=allow_unverified,
                                    cuda=device["cuda"], release_id=manifest["release_id"]))
    release = Release(release_id=manifest["release_id"], path=root, kernel_revision=rel["kernel_revision"],
                      model=rel["model"],
                      lock=lock, lock_digest=lock_digest(lock), drift=report, ops=ops, load_seconds=load_seconds,
                      load_errors=load_errors, notes=notes, declarations=rel["operators"], evidence=ev, snapshot=snap,
                      evidence_seal=seal)
    release.load_seconds["__total__"] = time.perf_counter() - t0
    return release


def _described(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, OpShape]]:
    """release.json, its specialization groups and operator shapes. Raises BundleIntegrityError
    naming the file for a structure the interpreting code cannot read (``described.read`` names
    the field for most; what is left is named by the exception the interpretation raised)."""
    from tileship.release import described

    rel = described.read(path)
    try:
        return rel, tuning.groups(rel), {name: op_shape(desc, name) for name, desc in rel["operators"].items()}
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BundleIntegrityError(f"{path}: malformed release description ({type(exc).__name__}: {exc})",
                                   path=str(path), hint="release.json is written by `tileship build`") from None


@dataclass
class _Context:
    """What deciding one specialization needs of the load in progress."""

    snap: Path
    blocking: bool
    reference_only: bool
    disabled: set[str]
    device: dict[str, Any]
    load_seconds: dict[str, float]
    load_errors: dict[str, str]
    #: the evidence is not the pinned one: nothing native runs, not even what may run unverified
    stale: bool = False


def _prepare(ctx: _Context, sid: str, info: dict[str, Any], spec: Specialization) -> tuple[str | None, Any]:
    """(reason the reference serves, None) or (None, the loaded kernel) before evidence is read."""
    target = Target(spec.target)
    if info["status"] != "built":
        return "build_failed", None
    if ctx.blocking:
        return "drift", None
    if ctx.reference_only or sid in ctx.disabled:
        return "disabled_by_policy", None
    if ctx.stale:
        return "unverified", None
    dev = ctx.device
    if target.device_type == "cuda" and (not dev["cuda"] or target.compute_capability
                                         not in dev.get("capabilities", [dev["capability"]])):
        return "device_not_covered", None
    t = time.perf_counter()
    try:
        return None, load_artifact(ctx.snap / "specs" / sid, sid)
    except ArtifactLoadError as exc:
        ctx.load_errors[sid] = str(exc)
        return "load_failed", None
    finally:
        ctx.load_seconds[sid] = time.perf_counter() - t


def _tuned_entries(ctx: _Context, members: list[tuple[str, dict[str, Any], Specialization]],
                   group: dict[str, Any]) -> list[Entry]:
    """Entries of one tuned group: the bucket winners serve (a dynamic group's each through a
    ``TunedRule`` for its buckets); the others are listed as ``not_selected``, or, when the reference
    won every bucket, the first candidate stands for the group as ``slower_than_reference``. A group whose
    reference tune could not check (``tuning.failure``) loads no kernel: the first candidate stands for it as
    ``tuning_failed``, the others are ``not_selected``."""
    if (failed := tuning.failure(group)) is not None:
        why = tuning.describe_failure(failed)
        return [Entry(spec, None, Decision(REFERENCE, tuning.TUNING_FAILED if i == 0 else tuning.NOT_SELECTED, sid),
                      detail=why) for i, (sid, _, spec) in enumerate(members)]
    won = tuning.winners(group)
    out: list[Entry] = []
    for sid, info, spec in members:
        cid = spec.candidate or "default"
        if cid not in won:
            out.append(Entry(spec, None, Decision(REFERENCE, tuning.NOT_SELECTED, sid),
                             detail="lost every tuned bucket"))
            continue
        reason, kernel = _prepare(ctx, sid, info, spec)
        if reason is not None:
            out.append(Entry(spec, None, Decision(REFERENCE, reason, sid)))
        elif group.get("dynamic_dim") is None:
            out.append(Entry(spec, kernel, Decision(KERNEL, KERNEL, sid),
                             detail=f"tuned: {group['points'][0].get('why', '')}"))
        else:
            rule = tuning.TunedRule(group, cid)
            out.append(Entry(spec, kernel, Decision(KERNEL, KERNEL, sid), detail=rule.summary, choose=rule))
    if not won:  # the reference won everywhere: one entry stands for the group so the reason is exact
        sid, _, spec = members[0]
        why = group["points"][0].get("why", "") if group.get("points") else ""
        out[0] = Entry(spec, None, Decision(REFERENCE, "slower_than_reference", sid), detail=f"tuned: {why}")
    return out


def op_shape(desc: dict[str, Any], name: str) -> OpShape:
    """What the dispatcher needs of a described operator (its outputs too: the fast launcher allocates them)."""
    exprs = call_dtypes(desc)
    inputs = tuple((n, tuple(d)) for n, d, *_ in desc["inputs"])
    outputs = tuple((str(n), tuple(str(d) for d in dims)) for n, dims, *_ in desc["outputs"])
    scalars = set(desc.get("scalars") or ())
    mutates = set(desc.get("mutates") or ())
    return OpShape(name, inputs, len(desc["outputs"]), tuple(exprs.get(n, "same") for n, _ in inputs),
                   tuple(i for i, (n, _) in enumerate(inputs) if n in scalars), outputs=outputs,
                   out_dtypes=tuple(exprs.get(n, "same") for n, _ in outputs),
                   mutates=tuple(i for i, (n, _) in enumerate(inputs) if n in mutates))


__all__ = ["load", "load_artifact", "BundleIntegrityError"]
