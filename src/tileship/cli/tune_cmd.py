"""``tileship tune`` (pick the winner per shape bucket on this device) and ``tileship explain``
(the routing decision of one shape, from the evidence file alone)."""

from __future__ import annotations

import typer
from rich.markup import escape

from tileship.cli import _common as common


@common.handle_errors
def tune_cmd(
    release: common.ReleaseDir,
    seeds: common.SeedsOption = "0,1",
    limit: common.LimitOption = None,
    budget_ms: float = typer.Option(40.0, min=0.001, help="measured milliseconds per timing run of one path"),
    rounds: int = typer.Option(5, help="timing rounds per bucket (their spread is the noise band)"),
    confirm_rounds: int = typer.Option(5, min=0, help="more rounds where only the noise band kept the reference "
                                                      "(0: never)"),
    flush: bool = typer.Option(True, help="overwrite a cache-sized buffer before every timing sample"),
    clock: str = typer.Option("latency", help="latency: max(host issue cost, device time), timed apart (stable "
                                              "where the host's speed moves); events: calls back to back between "
                                              "CUDA events"),
    host_gauge: bool = typer.Option(False, help="with --clock latency on CUDA: state host costs for the host at "
                                                "its fastest, by a probe timed in every sample (off: as timed)"),
    prune: float = typer.Option(3.0, min=0.0, help="skip a candidate at a bucket where one probe call takes more "
                                                   "than this many times the reference's (0: never)"),
    bucket: list[str] = typer.Option([], help="extra bucket point OP=SIZE for a T.dynamic dim (repeatable)"),
    device: common.DeviceOption = common.Device.all,
    only: list[str] = typer.Option([], help="operator name or group id (repeatable; default all)"),
    verifier_key: common.VerifierKeyOption = None,
) -> None:
    """Tune a release on this machine: per shape bucket, verify every candidate (poisoned outputs,
    float64 reference), time the passing ones and the reference as served (``--clock latency``: the
    larger of the host's cost to issue a call and the device's time for it, each timed apart with
    CUDA events and the L2 flushed between samples; five rounds: their spread is the noise band) and
    record the winner; a candidate
    wins only when it beats the reference beyond the noise. Stored in the release's evidence
    (release id unchanged; a signature is removed: re-sign). A group whose reference breaks its
    declaration (or raises) is recorded as failed, the reference keeps serving it, and the other groups
    are tuned. A candidate whose artifact does not load (whatever the error) cannot win; the others are tuned.
    An operator whose reference changed since the build (reference drift) fails each of its groups, naming the
    module; the other operators are tuned.

    Exit 0: every selected group was tuned and every candidate of it loaded. Exit 2: a group failed (its reference
    could not be checked, or drifted: the reference serves it) or a candidate's artifact did not load (it cannot
    win; the group's buckets were still decided), as build exits 2 for a specialization that failed; the evidence
    is written and the last line names them. Exit 1: tune could not run (nothing to tune on this machine, a
    release that is not intact, blocking drift of the environment, an unusable key)."""
    from tileship.release import tuning
    from tileship.verify.tune import TuneOptions, tune_release

    seed_list = common.parse_seeds(seeds)
    if clock not in ("latency", "events"):
        raise typer.BadParameter("expected latency or events", param_hint="--clock")
    if rounds < 2:
        raise typer.BadParameter("two rounds at least are needed (the noise band is their spread)",
                                 param_hint="--rounds")
    try:
        extra: dict[str, list[int]] = {}
        for b in bucket:
            op, size = b.split("=", 1)
            extra.setdefault(op, []).append(int(size))
    except ValueError:
        raise typer.BadParameter("expected OP=SIZE with an integer SIZE", param_hint="--bucket") from None

    seen: list[str] = []

    def progress(gid: str, group: dict) -> None:
        seen.append(gid)
        if (failed := tuning.failure(group)) is not None:
            common.console.print(f"  {gid}: [bold red]FAILED[/], the reference keeps it: "
                                 f"{escape(tuning.describe_failure(failed))}")
        for cid, why in tuning.unloaded(group).items():  # it cannot win: said once, not at every bucket
            common.console.print(f"  {gid}: [yellow]{escape(cid)}[/] {escape(why)}")
        for p in group["points"]:
            dims = ",".join(f"{k}={v}" for k, v in p["dims"].items())
            won = p["winner"] or "reference"
            common.console.print(
                f"  {gid} @ {dims}: [bold]{won}[/] (reference {p['reference']['median_us']:.2f} us, "
                f"noise {p['noise_us']:.2f} us, {p.get('rounds', rounds)} rounds)"
            )

    opts = TuneOptions(
        seeds=seed_list,
        limit=limit,
        budget_ms=budget_ms,
        rounds=rounds,
        confirm_rounds=confirm_rounds,
        flush=flush,
        clock=clock,
        host_gauge=host_gauge,
        prune=prune,
        buckets=extra,
        devices=device.devices(),
        only=tuple(only),
        on_group=progress,
    )
    data = tune_release(release, opts, verifier_key=verifier_key)
    failed = {gid: f for gid, f in tuning.failures(data["tuning"]).items() if gid in seen}  # of this run
    ran = {gid: data["tuning"][gid] for gid in seen}  # this run's groups, not those kept from an earlier tune
    points = [p for g in ran.values() for p in g["points"]]
    kernels = sum(1 for p in points if p["winner"])
    measured = len(ran) - len(failed)
    common.console.print(
        f"tuned {measured} groups, {len(points)} buckets: a kernel wins {kernels}, the "
        f"reference {len(points) - kernels} (release {data['release_id']}; evidence in "
        f"{release / 'evidence' / 'verification.json'}, "
        + ("signed" if (release / "evidence" / "verification.sig").exists() else "unsigned") + ")"
    )
    unloaded = {f"{gid}/{cid}": why for gid in seen for cid, why in tuning.unloaded(data["tuning"][gid]).items()}
    said = []
    if failed:
        said.append(f"tune could not check the reference of {len(failed)} group{'s' if len(failed) != 1 else ''} "
                    "(the reference serves them, nothing of them was measured): "
                    + "; ".join(f"{gid} ({tuning.describe_failure(f)})" for gid, f in sorted(failed.items())))
    if unloaded:
        said.append(f"{len(unloaded)} candidate{' did' if len(unloaded) == 1 else 's did'} not load (they cannot "
                    "win; the reference and the other candidates decided their buckets): "
                    + "; ".join(f"{c} ({why})" for c, why in sorted(unloaded.items())))
    if said:  # one line, the last: a script reads what failed from it
        common.err_console.print("[bold red]error[/]: " + escape(". ".join(said)))
        raise typer.Exit(common.EXIT_SOME_FAILED)


@common.handle_errors
def explain_cmd(
    release: common.ReleaseDir,
    op: str = typer.Argument(..., help="operator name"),
    dims: list[str] = typer.Argument(..., help="DIM=SIZE for every dim, e.g. M=16 N=4096 K=4096"),
    dtype: str | None = typer.Option(None, help="operator dtype (default: each declared one)"),
) -> None:
    """Print the routing decision of one shape and the numbers behind it, from the release's
    evidence file alone (no GPU, nothing loaded). Exit 1 when no specialization covers the shape."""
    from tileship.release.explain import explain

    try:
        sizes = {k: int(v) for k, v in (d.split("=", 1) for d in dims)}
    except ValueError:
        raise typer.BadParameter("expected DIM=SIZE, e.g. M=16", param_hint="DIMS") from None
    lines, found = explain(release, op, sizes, dtype=dtype)
    for line in lines:
        common.console.print(line, markup=False)
    if not found:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)
    app.command("explain")(explain_cmd)
