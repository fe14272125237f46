from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import (
    EXIT_SOME_FAILED,
    Device,
    DeviceOption,
    LimitOption,
    ReleaseDir,
    SeedsOption,
    VerifierKeyOption,
    console,
    escape,
    handle_errors,
    parse_seeds,
)


def parse_tolerances(values: list[str]) -> dict[str, dict[str, object]]:
    """``OP:DTYPE=ATOL,RTOL`` entries -> {op: {dtype: Tolerance}}; BadParameter names the bad entry."""
    from tileship.declare.spec import DTYPES, Tolerance

    out: dict[str, dict[str, object]] = {}
    for raw in values:
        try:
            head, nums = raw.split("=", 1)
            op, dtype = head.split(":", 1)
            atol, rtol = (float(x) for x in nums.split(","))
        except ValueError:
            raise typer.BadParameter(f"{raw!r}: expected OP:DTYPE=ATOL,RTOL, e.g. gemm:float16=3e-2,3e-2",
                                     param_hint="--tolerance") from None
        if dtype not in DTYPES:
            raise typer.BadParameter(f"{raw!r}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})",
                                     param_hint="--tolerance")
        if atol < 0 or rtol < 0:
            raise typer.BadParameter(f"{raw!r}: tolerances must be >= 0", param_hint="--tolerance")
        out.setdefault(op, {})[dtype] = Tolerance(atol, rtol)
    return out


def _fmt(v: float | None, spec: str = ".2e") -> str:
    return "-" if v is None else format(v, spec)


@handle_errors
def verify_cmd(
    release: ReleaseDir,
    seeds: SeedsOption = "0,1,2",
    limit: LimitOption = None,
    grid: int = typer.Option(4, min=0, help="ratio between verified T.dynamic sizes besides the edges; "
                                            "0: edge sizes only"),
    timing: bool = typer.Option(True, help="time kernel vs reference (needed for routing by speed)"),
    budget_ms: float = typer.Option(100.0, min=0.001, help="measured milliseconds per timing run (each path is "
                                                          "timed twice)"),
    warmup_ms: float = typer.Option(25.0),
    max_repeats: int = typer.Option(50, help="most timing samples per run"),
    reference_dtype: str = typer.Option("float64",
                                        help="precision of the reference the kernel is compared with: float64 or "
                                             "float32"),
    tolerance: list[str] = typer.Option([], help="override a declared tolerance: OP:DTYPE=ATOL,RTOL (repeatable)"),
    device: DeviceOption = Device.all,
    only: list[str] = typer.Option([], help="operator name or specialization id (repeatable; default all)"),
    strict_poison: bool = typer.Option(True, help="fail a run whose outputs could not be confirmed poisoned"),
    json_out: Path | None = typer.Option(None, help="also write the evidence JSON here"),
    verifier_key: VerifierKeyOption = None,
) -> None:
    """Verify a release on this machine's GPU (and CPU): correctness at every declared shape
    against a float64 reference with NaN-poisoned outputs, kernel vs reference timing, and a
    device fingerprint, stored as evidence/verification.json in the release (the release id
    does not change; a signature is removed: re-sign).

    Exit 0: every verified specialization passed. Exit 2: some failed (evidence written, they
    will serve the reference), an operator that does not import, an operator whose reference changed
    since the build (reference drift, named with its module) or an artifact that does not load
    included: the others are verified. Exit 1: verification could not run (nothing to verify here,
    a release that is not intact, blocking drift of the environment).
    """
    import json

    from rich.table import Table

    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    if reference_dtype not in ("float64", "float32"):
        raise typer.BadParameter(f"{reference_dtype!r}: use float64 or float32", param_hint="--reference-dtype")
    seed_list = parse_seeds(seeds)
    signed = (release / "manifest.sig").exists()

    def progress(spec_id: str, point: object) -> None:
        p = point  # PointResult
        t = p.timing  # type: ignore[attr-defined]
        dims = ",".join(f"{k}={v}" for k, v in p.dims.items())  # type: ignore[attr-defined]
        speed = (f"kernel {t.kernel.median_us:.1f} us vs reference {t.reference.median_us:.1f} us ({t.verdict})"
                 if t else "")
        state = "[green]ok[/]" if p.passed else "[red]FAIL[/]"  # type: ignore[attr-defined]
        console.print(f"  {spec_id} @ {dims}: {state} {speed}")

    opts = VerifyOptions(seeds=seed_list, limit=limit, grid=grid, timing=timing, budget_ms=budget_ms,
                         warmup_ms=warmup_ms,
                         max_repeats=max(max_repeats, 5), reference_dtype=reference_dtype,
                         tolerances=parse_tolerances(tolerance),  # type: ignore[arg-type]
                         devices=device.devices(), only=tuple(only),
                         strict_poison=strict_poison, on_point=progress)
    result = verify(release, opts, verifier_key=verifier_key)
    table = Table(title=f"release {result.release_id}: verification")
    for col in ("specialization", "shapes", "result", "worst |err|/tol", "kernel/ref at largest", "pinned route"):
        table.add_column(col)
    for v in result.verdicts:
        doc = result.evidence["specializations"][v.spec.id]
        last = v.points[-1] if v.points else None
        speed = (f"{last.timing.kernel.median_us:.1f}/{last.timing.reference.median_us:.1f} us"
                 if last and last.timing else "-")
        ratios = [r for p in v.points if (r := p.worst("tol_ratio")) is not None]
        table.add_row(v.spec.id, str(len(v.points)), "[green]passed[/]" if v.passed else "[red]FAILED[/]",
                      _fmt(max(ratios) if ratios else None, ".3f"), speed, doc["route"])
    console.print(table)
    for v in result.failed:
        console.print(f"[red]failed[/] {v.spec.id}: {escape(str(v.failure))}")
    for sid, why in sorted(result.skipped.items()):
        console.print(f"[dim]skipped {sid}: {escape(str(why))}[/]")
    for note in result.notes:
        console.print(f"[yellow]{escape(note)}[/]")
    dev = result.evidence.get("device") or {}
    console.print(f"device: {dev.get('name', 'no GPU')} cc {dev.get('compute_capability', '-')}, "
                  f"{dev.get('sm_count', '-')} SMs, "
                  f"driver {dev.get('driver', '-')}, CUDA {dev.get('cuda_runtime', '-')}, torch "
                  f"{result.evidence['host']['torch']}")
    console.print(f"evidence written to {release / 'evidence' / 'verification.json'} (release id {result.release_id} "
                  "unchanged)")
    sig = release / "evidence" / "verification.sig"
    console.print(f"evidence signed by verifier key {json.loads(sig.read_text())['key_id']}" if sig.exists()
                  else "[yellow]evidence unsigned[/]: servers that trust verifier keys will ignore it (--verifier-key)")
    if signed:
        console.print("[yellow]the release signature was removed (the manifest changed): re-sign it with `tileship "
                      "sign`[/]")
    if json_out:
        from tileship.release.atomic_file import write_file
        from tileship.release.bundle import json_bytes

        write_file(json_out, json_bytes(result.evidence))  # whole at any kill; through a symlink, mode kept
    if result.failed:
        raise typer.Exit(EXIT_SOME_FAILED)


@handle_errors
def report_cmd(
    release: Path = typer.Argument(..., help="release directory (verified or not)"),
    out: Path | None = typer.Option(None, "--out", "-o", help="output folder (default ./tileship-report-<release id>)"),
) -> None:
    """Write an HTML page with PNG plots from a release's verification evidence: per operator,
    speedup vs reference and error by shape, the path each shape takes and why, the device
    fingerprint and the lock summary."""
    from tileship.verify.report import write_report

    index = write_report(release, out)
    console.print(f"[green]wrote[/] {index}")


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_cmd)
    app.command("report")(report_cmd)
