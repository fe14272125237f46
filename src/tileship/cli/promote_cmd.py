"""``tileship promote``: build -> verify -> tune -> publish -> activate, directly or through a canary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from tileship.cli._common import BuildOutOption, JobsOption, ProjectOption, console, default_out, escape, handle_errors

EXIT_ROLLED_BACK = 3


def say_decision(d: dict[str, Any]) -> None:
    """One canary decision with its numbers, on one or a few lines."""
    n = d.get("numbers", {})
    colour = {"promote": "green", "rollback": "red"}.get(d["action"], "dim")
    req, err = n.get("requests", {}), n.get("errors", {})
    console.print(f"[{colour}]{d['action']}[/]: requests active {req.get('active')} canary {req.get('canary')}; errors "
                  f"active {err.get('active')} canary {err.get('canary')} (expected {err.get('canary_expected')}); "
                  f"{'; '.join(d.get('reasons', []))}")
    for model, row in sorted(n.get("models", {}).items()):
        if row.get("compared"):
            console.print(f"    {model}: p50 active {row['p50_active_ms']:.3f} ms, canary "
                          f"{row['p50_canary_ms']:.3f} ms "
                          f"(canary/active {row['ratio']:.3f}, limit {n.get('max_p50_ratio')}, noise "
                          f"{row['noise_ms']:.3f} ms); p95 {row['p95_active_ms']:.3f} / {row['p95_canary_ms']:.3f} ms")
        else:
            console.print(f"    {model}: not compared ({row['n_active']} active, {row['n_canary']} canary samples)")


@handle_errors
def promote_cmd(
    release: Path | None = typer.Argument(None, help="a built release directory (default: build the project first)"),
    project: ProjectOption = None,
    out: BuildOutOption = None,
    jobs: JobsOption = os.cpu_count() or 1,
    registry: Path | None = typer.Option(None, "--registry", help="registry directory (default: $TILESHIP_HOME/"
                                                                  "registry)"),
    server: str | None = typer.Option(None, help="URL of a running `tileship serve` (http://127.0.0.1:PORT): "
                                                 "activate through a canary there"),
    canary: float = typer.Option(0.1, "--canary", help="with --server: share of requests the new release serves"),
    window_requests: int = typer.Option(100, help="canary requests before it can be promoted"),
    window_seconds: float = typer.Option(0.0, help="and at least this many seconds"),
    max_p50_ratio: float = typer.Option(1.10, help="roll back when the canary's p50 exceeds this x the active's, "
                                                   "beyond noise"),
    max_extra_errors: float = typer.Option(0.0, help="errors the canary may have beyond the active release's rate"),
    timeout: float = typer.Option(600.0, help="seconds to wait for the canary's verdict"),
    verify: bool = typer.Option(True, help="verify on this machine before publishing"),
    tune: bool = typer.Option(True, help="tune on this machine before publishing (tileship tune)"),
    budget_ms: float = typer.Option(40.0, min=0.001, help="measured milliseconds per timing run in verify and tune"),
) -> None:
    """Take a release to production: build (unless RELEASE is given) -> verify -> tune ->
    publish -> activate. With --server, activation is a canary in that server: --canary P of
    its requests go to the new release, the server compares per-operator latency and errors
    with the active release over the window, then promotes it (server and registry) or rolls
    it back on its own; every decision is printed with its numbers. Without --server the
    registry's active pointer moves at once.

    Exit 0: active. Exit 1: a step failed (build, verification, load, refusal). Exit 3: the
    canary was rolled back (or aborted, or no verdict within --timeout).
    """
    from tileship.release import promote

    if server is not None and not 0.0 < canary <= 1.0:
        raise typer.BadParameter(f"{canary}: the canary share must be in (0, 1]", param_hint="--canary")
    if release is None:
        console.print("[bold]build[/]")
        release = promote.build(project, out or default_out(), jobs=jobs)
        console.print(f"  built {release}")
    if verify:
        console.print("[bold]verify[/]")
        console.print(f"  {promote.verify(release, budget_ms=budget_ms)}")
    if tune:
        console.print("[bold]tune[/]")
        console.print(f"  {promote.tune(release, budget_ms=budget_ms)}")
    console.print("[bold]publish[/]")
    reg, rid = promote.publish(registry, release)
    console.print(f"  published {rid} -> {reg.path_of(rid)}")
    if server is None:
        active = reg.activate(rid)
        console.print(f"[green]active[/]: {active.release_id} (previous {active.previous}); a server following "
                      f"{reg.root} switches on `POST /v2/repository/reload`")
        return
    console.print(f"[bold]canary[/] {rid} on {server}: {canary:g} of requests, window {window_requests} requests")
    policy = {"fraction": canary, "window_requests": window_requests, "window_seconds": window_seconds,
              "max_p50_ratio": max_p50_ratio, "max_extra_errors": max_extra_errors}
    result = promote.canary(server, str(reg.path_of(rid).resolve()), policy, timeout_s=timeout,
                            on_decision=say_decision)
    outcome = result.status.get("outcome") or {}
    if not result.promoted:
        why = outcome.get("reason") or f"no verdict within {timeout:g} s"
        console.print(f"[red]{result.state}[/]: {escape(str(why))}; the active release keeps serving, "
                      "the registry is unchanged")
        raise typer.Exit(EXIT_ROLLED_BACK)
    if outcome.get("registry") is None:  # the server follows a release directory: move our registry's pointer too
        active = reg.activate(rid)
        console.print(f"  registry {reg.root}: active {active.release_id}")
    console.print(f"[green]promoted[/] {rid}: the server serves it and the registry's active pointer names it "
                  f"(previous {outcome.get('previous')})")


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_cmd)
