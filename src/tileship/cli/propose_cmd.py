from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import console, escape, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("propose")
    @handle_errors
    def propose(telemetry: Path = typer.Argument(..., help="a telemetry JSON (GET /v2/tileship/telemetry, "
                                                         "or release.telemetry() saved)"),
                project: Path | None = typer.Option(None, help="the project file (default: found from the cwd)"),
                release: Path | None = typer.Option(None, help="a built release (build-log.json: compile seconds)"),
                out: Path | None = typer.Option(None, help="write the [shapes.<operator>] TOML here (default: print)"),
                apply: bool = typer.Option(False, "--apply", help="rewrite the project file's [shapes.*] tables"),
                ) -> None:
        """Propose shapes to declare from shape telemetry: static shapes, or added/widened T.dynamic ranges.

        Only calls the reference served as ``undeclared_shape`` can move onto kernels; other
        reasons are listed as not fixable by shapes. Each proposal shows the share of observed
        calls and of reference seconds it would move, and the build time it adds.
        """
        from tileship.cli._common import resolve_project
        from tileship.declare.project import load_operators
        from tileship.declare.propose import propose as run
        from tileship.declare.propose import read_telemetry, to_toml
        from tileship.declare.propose_apply import apply_to_project

        proj = resolve_project(project)
        ops = load_operators(proj)
        report = run(read_telemetry(telemetry), ops, targets=proj.targets, release=release)
        for p in report.proposals:
            console.print(f"[bold]{p.operator}[/] {p.kind} {p.static if p.static is not None else p.range}"
                          f"{' (' + p.note + ')' if p.note else ''}\n"
                          f"    moves {p.calls} calls ({p.calls_share:.1%} of observed calls, {p.reference_share:.1%} "
                          f"of reference calls) and {p.seconds:.4g} s ({p.seconds_share:.1%} of reference seconds); "
                          f"build: {p.specializations} specialization(s), ~{p.build_seconds:g} s")
        build = sum(p.build_seconds for p in report.proposals)
        console.print(f"{len(report.proposals)} proposal(s), ~{build:g} s of compile in all (serial; "
                      f"{report.compile_seconds_source})")
        for op, what, why in report.dropped:
            console.print(f"[yellow]dropped[/] {op} {escape(str(what))}: {escape(str(why))}")
        for (op, reason), (calls, secs) in sorted(report.not_fixable.items()):
            console.print(f"[dim]not fixable by shapes[/] {op} {reason}: {calls} calls, {secs:.4g} s")
        for op, calls in sorted(report.tail.items()):
            console.print(f"[dim]tail[/] {op}: {calls} calls on rare shapes not proposed")
        if not report.proposals:
            return
        text = to_toml(report.proposals, ops)
        if apply:
            console.print(f"[green]applied[/] to {apply_to_project(proj, report.proposals, ops)}")
        if out is not None:
            from tileship.release.atomic_file import write_file

            write_file(out, text)  # killed at any instant: the old file or the new one, whole; mode kept
            console.print(f"wrote {out}")
        elif not apply:
            print(text, end="")
