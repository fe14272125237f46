"""``tileship tune RELEASE``: pick the fastest verified candidate per shape bucket, on the target device.

For every group (operator x dtype x shape or ``T.dynamic`` range x target, see
``tileship.release.tuning``) this machine can run, at each bucket point (a static shape; for a
range the powers of two plus its edges):

0. a candidate more than ``prune`` times slower than the reference in one probe call is pruned
   there (``tune_rule.triage``: recorded as its failure at that bucket, never verified or timed);
1. every other candidate is verified with verification's method (poisoned outputs, float64 reference,
   the declared tolerances, several seeds): a candidate that fails there cannot win there;
2. the reference and every passing candidate are timed with one method, as they are served:
   each through a dispatcher of its own (the same launcher and compiled dispatch table serving
   uses), inputs rotated across sets that overflow the cache, warm-up, the L2 flushed before
   every sample; on CUDA by the latency clock (``verify.latency``: the larger of the host's cost to
   issue a call and the device's time for it, timed apart, so that a host slowed by its neighbours
   does not decide; with ``host_gauge``, host costs scaled to the host at its fastest), else
   (``clock="events"``, and on the CPU) the median of back-to-back samples (CUDA events,
   perf_counter); five rounds in a rotating order; a path's time is the median of
   its round medians and its spread twice their median absolute deviation
   (``timing.round_spread``); the larger spread of two paths is their noise band;
3. the fastest candidate wins only when it beats the reference by more than that band
   (``tileship.release.tuning``); otherwise the reference keeps the bucket. When only the band
   kept the reference (the candidate's median is faster by more than ``NOISE_FLOOR``: one
   disturbed round can widen the band past a real gap), ``confirm_rounds`` more rounds run and
   the rule is applied again to all of them.

The table, with every number behind each decision, goes into the release's evidence next to
verification (``evidence/verification.json``: hashed, bound to the lock digest and the device
fingerprint); verification entries of other specializations are kept when they still apply.
Groups with one kernel (no candidates) are tuned too: kernel against reference, same rule.
A group whose reference cannot be checked (its answer is unlike its declaration: ``runtime.answer``'s words
naming the operator and the output; or it raised) is recorded as failed (``tuning.failure``: the point and the
reason), before anything of it is verified or timed: the reference keeps serving it, no kernel is routed there,
and the other groups are tuned as usual. So is every group of an operator whose reference or sample hook does not
import or whose pins do not hold (``tune_checks.prepare``: the reason names the step and the error), and a group whose
sample hook or reference raises later, on the rotated input sets timing makes (``making inputs failed: ...``, ``the
reference raised ... while timed``) or on the inputs of a candidate's verification (the candidates are not to blame):
what it measured is dropped, the run goes on. A candidate that raises while timed (its breaker then served the
reference) is failed there and at later buckets, never timed as the reference. Never compiles.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from tileship.declare.inputs import make_inputs, point_seed
from tileship.declare.spec import Specialization, Target, tensor_dtypes
from tileship.errors import DeclarationError, VerificationError
from tileship.release import bundle, evidence_write, tuning
from tileship.release import evidence as ev_mod
from tileship.verify import tune_evidence
from tileship.verify.latency import HostGauge, latency, probe
from tileship.verify.spec_check import VerifyOptions, verify_spec
from tileship.verify.timing import l2_flush_buffer, measure, rotation_sets
from tileship.verify.tune_checks import blames_reference, inputs_failed, load_member, prepare, reference_raised
from tileship.verify.tune_options import TuneOptions
from tileship.verify.tune_rule import time_and_decide, triage
from tileship.verify.verify import open_for_evidence


def bucket_points(
    spec: Specialization, *, limit: int | None, extra: Sequence[int]
) -> list[tuple[dict[str, int], list[int]]]:
    """[(dims, [first, last])] per bucket of ``spec`` (one, the shape itself, when static)."""
    dims = spec.dim_map()
    dyn = spec.dynamic_dim
    if dyn is None:
        return [({d: int(v) for d, v in dims.items()}, [0, 0])]  # type: ignore[arg-type]
    lo, hi = dims[dyn]  # type: ignore[misc]
    top = hi if limit is None else max(lo, min(hi, limit))
    return [
        ({d: (p if d == dyn else int(v)) for d, v in dims.items()}, [first, last])  # type: ignore[arg-type]
        for p, first, last in tuning.buckets(lo, top, extra)
    ]


def _runner(desc: Mapping[str, Any], name: str, reference: Any, spec: Specialization, kernel: Any,
            table: Path | None = None) -> Any:
    """A dispatcher serving only ``kernel`` (or only the reference when None): timed as served. With
    ``table`` (the release's root, when the served operator gets the compiled dispatch table:
    ``runtime.native``) it gets that table too, as the loaded release's dispatcher does; without
    it a kernel would be timed through the Python path, about 2 us a call slower on the H200 host,
    and a reference through the same cost either way."""
    from tileship.runtime import native
    from tileship.runtime.dispatch import KERNEL, REFERENCE, Decision, Entry, OpRunner
    from tileship.runtime.loader import op_shape

    decision = Decision(KERNEL, KERNEL, spec.id) if kernel is not None else Decision(REFERENCE, "tuning", spec.id)
    shape = op_shape(dict(desc), name)
    runner = OpRunner(shape, reference, [Entry(spec, kernel, decision)])
    if table is not None:
        native.attach_runner(table, runner)
    return runner


def _check_reference(runner: Any, make: Callable[[], Sequence[Any]]) -> str | None:
    """None when one call of the reference-only dispatcher ``runner`` on ``make()`` answers as declared; else why
    not: ``runtime.answer``'s words (the operator, the output, what it answered and what is declared), or what
    the call (or making its inputs) raised. A group whose baseline is wrong cannot be tuned, and no time is spent
    measuring it. A sticky CUDA error is raised (every later group would fail with it: not its own failure)."""
    try:
        args = make()
    except Exception as exc:  # noqa: BLE001 -- the operator's sample hook failed: the group's failure, not the run's
        return inputs_failed(exc)
    try:
        runner(*args)
    except DeclarationError as exc:
        return exc.message
    except Exception as exc:  # noqa: BLE001 -- a reference that raises cannot be the baseline either
        return reference_raised(exc)
    return None


def served_table(root: Path | None, kernels: Sequence[Any]) -> Path | None:
    """``root`` when the loaded release would give the operator of ``kernels`` its compiled table
    (one of them is a kernel the table launches: ``runtime.native.attach``), else None."""
    from tileship.runtime import native

    return root if root is not None and any(native.is_native(k) for k in kernels) else None


def tune_group(
    gid: str,
    members: Sequence[tuple[str, Specialization, Any]],
    reference: Any,
    desc: Mapping[str, Any],
    *,
    options: TuneOptions,
    sample: Any = None,
    root: Path | None = None,
    gauge: HostGauge | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Tune one group: ``members`` are (spec id, spec, loaded kernel or a failure text). Returns the
    group's table and the candidates' SpecVerdicts (their verification evidence); a group whose reference
    could not be checked at a point returns its failure (``tuning.failure``) and no verdicts. ``root``: the
    release, whose compiled dispatch table the timed dispatchers get where serving would use it;
    ``gauge``: the latency clock's host gauge (``verify.latency``)."""
    spec0 = members[0][1]
    device = Target(spec0.target).device_type
    extra = options.buckets.get(spec0.op, ())
    points = bucket_points(spec0.group(), limit=options.limit, extra=extra)
    vopts = VerifyOptions(seeds=options.seeds, timing=False, devices=options.devices)
    inputs = [(n, tuple(ds)) for n, ds, *_ in desc["inputs"]]
    in_dtypes = tensor_dtypes(desc, "inputs", spec0.dtype)
    scalars = [i for i, (n, _) in enumerate(inputs) if n in set(desc.get("scalars") or ())]

    def make(d: Mapping[str, int], i: int) -> list[Any]:
        return make_inputs(inputs, d, spec0.dtype, device, point_seed(20_000 + i, gid, d), dtypes=in_dtypes,
                           sample=sample, scalars=scalars)

    name = spec0.op
    table = served_table(root, [k for *_, k in members if not isinstance(k, str)])
    runners = {"": _runner(desc, name, reference, spec0, None, table)}
    for _sid, spec, kernel in members:
        if not isinstance(kernel, str):
            runners[spec.candidate or "default"] = _runner(desc, name, reference, spec, kernel, table)
    for dims, _ in points:  # before anything is timed: the reference's answer held to its declaration
        if (why := _check_reference(runners[""], partial(make, dims, 0))) is not None:
            return tune_evidence.failed_group(spec0, [m[1] for m in members], dims, why), []
    pruned: dict[str, dict[str, str]] = {}  # candidate -> bucket key -> why (``tune_rule.triage``)
    # only among candidates: a group's single kernel is always verified (its evidence is the release's)
    for dims, _ in points if options.prune and len(runners) > 2 else ():
        args = make(dims, 0)

        def look(c: str, limit_us: float, args: list[Any] = args) -> float:
            return probe(runners[c], args, device=device, limit_us=limit_us)

        for c, why in triage([c for c in runners if c], look, options.prune).items():
            pruned.setdefault(c, {})[json.dumps(dims, sort_keys=True)] = why
        del args
    for c, r in runners.items():  # a kernel that raised in a probe tripped its dispatcher's breaker
        if c and r.faults:
            why = f"the kernel failed in a probe call: {r.faults}"
            pruned[c] = {json.dumps(p, sort_keys=True): why for p, _ in points}
    verdicts = []
    passed: dict[str, dict[str, str | None]] = {}
    for _sid, spec, kernel in members:
        cid = spec.candidate or "default"
        if isinstance(kernel, str):
            passed[cid] = {json.dumps(p, sort_keys=True): kernel for p, _ in points}
            continue
        skip = pruned.get(cid, {})
        todo = [p for p, _ in points if json.dumps(p, sort_keys=True) not in skip]
        passed[cid] = dict(skip)
        if todo:
            v = verify_spec(spec, kernel, reference, desc, options=vopts, sample=sample, points=todo)
            # the reference (or sample hook) failing on the verification's inputs is the group's failure: else
            # every candidate would fail with it and the broken reference be recorded as the winner
            if (blamed := next((q for q in v.points if blames_reference(q.failure, name)), None)) is not None:
                return tune_evidence.failed_group(spec0, [m[1] for m in members], blamed.dims, str(blamed.failure)), []
            verdicts.append(v)
            passed[cid].update({json.dumps(p.dims, sort_keys=True): p.failure for p in v.points})
    flush = l2_flush_buffer(device) if options.flush else None
    table_points = []
    for dims, bucket in points:
        key = json.dumps(dims, sort_keys=True)
        ok = [c for c in runners if c and passed.get(c, {}).get(key, "x") is None]

        def fresh(i: int, d: Mapping[str, int] = dims) -> list[Any]:
            return make(d, i)

        try:  # the later sets are new calls of the sample hook: one that fails there fails the group, not the run
            sets = rotation_sets(fresh(0), fresh, device=device, out_bytes=0)
        except Exception as exc:  # noqa: BLE001 -- a sticky CUDA error is raised by inputs_failed
            return tune_evidence.failed_group(spec0, [m[1] for m in members], dims, inputs_failed(exc)), []

        parts: dict[str, dict[str, list[float]]] = {}

        def time_one(c: str, sets: list[Any] = sets, flush: Any = flush,
                     parts: dict[str, dict[str, list[float]]] = parts) -> float:
            kw = {"device": device, "warmup_ms": options.warmup_ms, "budget_ms": options.budget_ms,
                  "min_repeats": options.min_repeats, "max_repeats": options.max_repeats, "flush": flush}
            if options.clock == "events":
                return measure(runners[c], sets, **kw).median_us
            lat = latency(runners[c], sets, gauge=gauge, **kw)
            got = parts.setdefault(c or "reference", {"host": [], "device": [], "host_raw": [], "slowdown": []})
            for k, v in (("host", lat.host_us), ("device", lat.device_us), ("host_raw", lat.host_raw_us),
                         ("slowdown", lat.slowdown)):
                got[k].append(v)
            return lat.latency_us

        try:  # a kernel that raises trips its dispatcher's breaker; what escapes is the reference's
            point = time_and_decide(dims, bucket, ["", *ok], passed, key, time_one, options.rounds,
                                    options.confirm_rounds)
        except Exception as exc:  # noqa: BLE001 -- a sticky CUDA error is raised by reference_raised
            why = reference_raised(exc, " while timed on the rotated input sets")
            return tune_evidence.failed_group(spec0, [m[1] for m in members], dims, why), []
        for c in (c for c in ok if runners[c].faults):  # it raised while timed: its breaker served the reference
            why = f"the kernel failed while timed: {runners[c].faults}"  # (timed as the reference): it cannot win
            point["candidates"][c] = {"passed": False, "failure": why}
            point.update({"winner": None, "why": why} if point["winner"] == c else {})
            passed[c].update({json.dumps(p, sort_keys=True): why for p, _ in points})  # nor at a later bucket
        if parts:  # what each round's latency was made of: host issue cost (as used, and as timed), device time
            point["clock_parts_us"] = parts
        table_points.append(point)
        del sets, time_one  # the inputs are freed before the next point's are made
    del flush
    group = {
        "op": spec0.op,
        "dtype": spec0.dtype,
        "target": spec0.target,
        "dynamic_dim": spec0.dynamic_dim,
        "candidates": [m[1].candidate or "default" for m in members],
        "points": table_points,
    }
    return group, verdicts


def tune_release(path: Path | str, options: TuneOptions = TuneOptions(), *, write: bool = True,
                 verifier_key: Path | None = None) -> dict[str, Any]:
    """Tune every group of the release at ``path`` this machine can run; returns (and with ``write``
    stores) the evidence, signed with ``verifier_key`` (default: ``TILESHIP_VERIFIER_KEY``; none:
    unsigned). Signing, earlier evidence is kept only when it is signed by that key or a trusted
    verifier key (a signature must not vouch for entries it did not measure). A group whose reference could
    not be checked, or whose operator's reference or sample hook did not import or whose pins did not hold, is
    stored as failed (``tuning.failures`` of the table finds it) and the run goes on: the caller decides what that
    means (``tileship tune`` exits 2 naming it). Raises BundleIntegrityError for a release that is not intact,
    SignatureError for an unusable key, VerificationError on blocking drift of the environment or when nothing
    can be tuned here."""
    import torch

    from tileship import env
    from tileship.build.lock import lock_digest
    from tileship.runtime import nojit
    from tileship.runtime.loader import load_artifact
    from tileship.runtime.references import import_reference, import_sample, use_sources

    root, manifest, rel, lock = open_for_evidence(path)
    env.ensure_tilelang_cache_dir()
    nojit.install()
    use_sources(root)
    cuda = torch.cuda.is_available()
    digest = lock_digest(lock)
    verifier_key = verifier_key or env.verifier_key()
    if write and verifier_key is not None:
        bundle.load_private_key(verifier_key)  # an unusable key fails before minutes of measuring
    ev_mod.read(root)  # and evidence that is not tileship evidence (read again, to merge, when written)
    verdicts: dict[str, Any] = {}
    table: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    prepared: dict[str, tuple[Any, Any] | str] = {}  # operator -> (reference, sample hook), or why not
    gauge = None
    if cuda and options.clock == "latency" and options.host_gauge and "cuda" in options.devices:
        gauge = HostGauge("cuda")
        gauge.calibrate()
    for gid, members in tuning.groups(rel).items():
        spec0 = members[0][2]
        dev = Target(spec0.target).device_type
        if options.only and spec0.op not in options.only and gid not in options.only:
            continue
        why = None if dev in options.devices else f"{dev} not selected"
        if dev == "cuda" and why is None:
            if not cuda:
                why = "no CUDA GPU here"
            elif tuple(torch.cuda.get_device_capability(0)) != Target(spec0.target).compute_capability:
                why = f"built for {Target(spec0.target).arch}"
        if why:
            skipped[gid] = why
            continue
        desc = rel["operators"][spec0.op]
        if spec0.op not in prepared:  # once per operator: a failure of it fails each of its groups, not the run
            prepared[spec0.op] = prepare(desc, spec0.op, lock, import_reference, import_sample)
        if isinstance(got := prepared[spec0.op], str):
            specs = [m[2] for m in members]
            dims = bucket_points(spec0.group(), limit=options.limit, extra=options.buckets.get(spec0.op, ()))[0][0]
            table[gid] = group = tune_evidence.failed_group(spec0, specs, dims, got)
            if options.on_group:
                options.on_group(gid, group)
            continue
        reference, sample = got
        loaded: list[tuple[str, Specialization, Any]] = []
        for sid, info, spec in members:
            if info["status"] != "built":
                loaded.append((sid, spec, "build failed"))
                continue
            loaded.append((sid, spec, load_member(load_artifact, root / "specs" / sid, sid)))  # or why not
        group, spec_verdicts = tune_group(
            gid, loaded, reference, desc, options=options, sample=sample, root=root,
            gauge=gauge if dev == "cuda" else None,
        )
        table[gid] = group
        verdicts.update((v.spec.id, v.to_json()) for v in spec_verdicts)
        if options.on_group:
            options.on_group(gid, group)
    if not table:
        raise VerificationError(
            f"nothing to tune on this machine ({len(skipped)} groups skipped: "
            f"{', '.join(sorted(set(skipped.values())))})",
            hint="run `tileship tune` on the GPU the release will serve on",
        )

    def merge(old: dict[str, Any] | None) -> dict[str, Any]:
        return tune_evidence.merge(old, root=root, release_id=manifest["release_id"], digest=digest, cuda=cuda,
                                   verifier_key=verifier_key, groups=table, verdicts=verdicts, options=options,
                                   gauge=gauge)

    if not write:
        return merge(ev_mod.read(root))
    # read, merged and written under the release's writer lock: a verify or tune that stored evidence
    # while this one measured keeps it
    return evidence_write.update(root, merge, verifier_key=verifier_key)
