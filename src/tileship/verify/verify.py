"""Verify a release on the device it will serve on; store the evidence with the release.

For every specialization this machine can run (CUDA ones on a GPU, ``"c"`` ones anywhere),
``spec_check.verify_spec`` checks correctness at several shapes against a float64 reference, with
outputs poisoned before each run, and times kernel and reference as served (noise band included);
specializations it cannot run, or not selected, are recorded as skipped with the reason.

``verify`` writes ``evidence/verification.json`` (see ``tileship.release.evidence``) and re-hashes
the release; the release id does not change. The evidence is merged (``verify_evidence``): the specializations
this run verified are replaced, every other entry and the tune table are kept while they describe this release
here (a tune group whose winner this run failed is dropped, with a note). Never
compiles: artifacts are loaded from the bundle with the no-JIT guard installed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tileship.declare.spec import Specialization, Target, tensor_tolerance
from tileship.errors import BundleIntegrityError, VerificationError
from tileship.release import bundle, evidence_write
from tileship.release import evidence as ev_mod
from tileship.verify import verify_evidence
from tileship.verify.results import SpecVerdict, VerifyResult
from tileship.verify.spec_check import VerifyOptions, verify_spec
from tileship.verify.timing import NOISE_FLOOR
from tileship.verify.tune_checks import DRIFTED, load_member, prepare


def open_for_evidence(path: Path | str) -> tuple[Path, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(root, manifest, release.json, lock) of a release about to get evidence (verify, tune).
    Raises BundleIntegrityError for a release that is not intact and VerificationError on blocking
    drift: measurements taken here would not describe its artifacts."""

    from tileship.build.lock import capture_environment, compare, read_lock
    from tileship.release import bundle, described

    root = Path(path)
    manifest = bundle.check_integrity(root)
    rel = described.read(root / "release.json")
    lock = read_lock(root / "tileship.lock")
    drift = compare(lock, capture_environment())
    if drift.blocking:
        raise VerificationError(f"blocking drift against the release lock ({drift.reason}): evidence taken here would "
                                "not describe these artifacts",
                                hint="run `tileship check` on this machine; verify and tune where the release will "
                                     "serve, with the locked toolchain")
    return root, manifest, rel, lock


def _not_run(spec: Specialization, desc: dict[str, Any], options: VerifyOptions, failure: str) -> SpecVerdict:
    """The failed verdict of a specialization that could not be checked at all (no point): ``failure`` says why."""
    tol = tensor_tolerance({k: v for k, v in desc.items() if k != "output_tolerances"}, "", spec.dtype)
    return SpecVerdict(spec, Target(spec.target).device_type, tol, False, options.reference_dtype, (), failure)


def verify(path: Path | str, options: VerifyOptions = VerifyOptions(), *, write: bool = True,
           verifier_key: Path | None = None) -> VerifyResult:
    """Verify every specialization of the release at ``path`` that this machine can run.

    Raises BundleIntegrityError for a release that is not intact, VerificationError when
    nothing can be verified here or the environment drifted from the lock in a blocking way
    (evidence taken there would not describe the artifacts). A kernel that is wrong is a value
    (``SpecVerdict.failure``), not an exception; so is an artifact that does not load (whatever its load raised),
    every specialization of an operator whose reference or sample hook does not import (the failure names the
    step and the error: ``the operator did not import here (import_reference: ArtifactLoadError: ...)``) and
    every specialization of an operator whose reference changed since the build (``its reference changed since
    the build (pins.require: ReferenceDrift: reference drift: operator ..., module ...)``; nothing of it is
    measured, as ``tune`` fails its groups): the other operators are verified.
    With ``write``, stores the evidence merged into the release's (``verify_evidence.merge``; its notes, in
    ``VerifyResult.notes``, say what of the stored evidence was replaced or dropped), signed
    with ``verifier_key`` (default: ``TILESHIP_VERIFIER_KEY``; none: unsigned; see
    ``release.evidence_seal``); SignatureError for an unusable key, before verifying anything.
    """

    import torch

    from tileship import env
    from tileship.build.lock import lock_digest
    from tileship.runtime import nojit
    from tileship.runtime.loader import load_artifact
    from tileship.runtime.references import import_callable, import_reference, import_sample, use_sources
    from tileship.verify import roofline

    root, manifest, rel, lock = open_for_evidence(path)
    verifier_key = verifier_key or env.verifier_key()
    if write and verifier_key is not None:
        bundle.load_private_key(verifier_key)  # an unusable key fails before minutes of measuring
    unknown = sorted(n for n in options.tolerances if n not in rel["operators"])
    if unknown:
        raise VerificationError(f"tolerance override for unknown operator(s) {unknown} (release has: "
                                f"{', '.join(sorted(rel['operators']))})")
    env.ensure_tilelang_cache_dir()
    nojit.install()
    use_sources(root)
    cuda = torch.cuda.is_available()
    verdicts: list[SpecVerdict] = []
    skipped: dict[str, str] = {}
    prepared: dict[str, tuple[Any, Any] | str] = {}  # operator -> (reference, sample hook), or why not
    for sid, info in sorted(rel["specializations"].items()):
        spec = Specialization.from_json(info["spec"])
        target = Target(spec.target)
        if options.only and spec.op not in options.only and sid not in options.only:
            skipped[sid] = "not selected"
            continue
        if info["status"] != "built":
            skipped[sid] = "build failed"
            continue
        if target.device_type not in options.devices:
            skipped[sid] = f"{target.device_type} not selected"
            continue
        if target.device_type == "cuda":
            if not cuda:
                skipped[sid] = "no CUDA GPU here"
                continue
            if tuple(torch.cuda.get_device_capability(0)) != target.compute_capability:
                skipped[sid] = (f"built for {target.arch}, this GPU is "
                                f"sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}")
                continue
        desc = rel["operators"][spec.op]
        if spec.op not in prepared:  # once per operator: its import failing fails its specializations, not the run
            # so does a changed reference (pins): evidence against it would not describe this release
            prepared[spec.op] = prepare(desc, spec.op, lock, import_reference, import_sample)
        if isinstance(got := prepared[spec.op], str):
            said = "its reference changed since the build" if got.startswith(DRIFTED) else "the operator did not " \
                "import here"
            verdicts.append(_not_run(spec, desc, options, f"{said} ({got})"))
            continue
        kernel = load_member(load_artifact, root / "specs" / sid, sid)  # or why not (any error its load raised)
        if isinstance(kernel, str):
            verdicts.append(_not_run(spec, desc, options, kernel))
            continue
        verdicts.append(verify_spec(spec, kernel, got[0], desc, options=options, sample=got[1]))
        del kernel
    if not verdicts:  # nothing stored: the evidence there is left as it was
        raise VerificationError(f"nothing to verify on this machine ({len(skipped)} specializations skipped: "
                                f"{', '.join(sorted(set(skipped.values())))})",
                                hint="run `tileship verify` on the GPU the release will serve on")
    data = {
        "schema": ev_mod.SCHEMA,
        "release_id": manifest["release_id"],
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lock_digest": lock_digest(lock),
        "device": ev_mod.current_device(),
        "host": ev_mod.current_host(),
        "options": {"seeds": list(options.seeds), "limit": options.limit, "grid": options.grid,
                    "timing": options.timing,
                    "warmup_ms": options.warmup_ms, "budget_ms": options.budget_ms, "min_repeats": options.min_repeats,
                    "max_repeats": options.max_repeats, "reference_dtype": options.reference_dtype,
                    "noise_floor": NOISE_FLOOR, "strict_poison": options.strict_poison,
                    "tolerance_overrides": {op: {dt: {"atol": t.atol, "rtol": t.rtol} for dt, t in m.items()}
                                            for op, m in options.tolerances.items()}},
        "skipped": dict(sorted(skipped.items())),
        "specializations": {v.spec.id: v.to_json() for v in verdicts},
    }
    roofline.add_to_evidence(data, verdicts, rel["operators"], lambda path, op: import_callable(path, op, "cost model"))
    specs = {sid: Specialization.from_json(info["spec"]) for sid, info in rel["specializations"].items()}
    members = {sid: (s.group_id, s.candidate or "default") for sid, s in specs.items()}
    notes: list[str] = []

    def merge(old: dict[str, Any] | None) -> dict[str, Any]:
        notes.clear()  # called once, under the writer lock
        return verify_evidence.merge(old, data, root=root, cuda=cuda, verifier_key=verifier_key if write else None,
                                     members=members, notes=notes)

    def unreadable(exc: Exception) -> None:
        notes.append(f"the stored evidence could not be read ({exc}): replaced by this run's")

    if write:  # merged with the evidence as it is now, under the release's writer lock
        data = evidence_write.update(root, merge, verifier_key=verifier_key, on_unreadable=unreadable)
    else:
        try:
            data = merge(ev_mod.read(root))
        except BundleIntegrityError as exc:
            unreadable(exc)
    return VerifyResult(manifest["release_id"], root, tuple(verdicts), skipped, data, tuple(notes))
