"""The drill's verdict: requests per switch window summarized, and the text report."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tileship.verify.drill import DrillOptions, Window
    from tileship.verify.drill_load import Record, Sample


def summarize(records: list[Record], windows: list[Window], samples: list[Sample], skipped: list[str], *,
              new: str, old: str, url: str, ready: dict[str, Any], opts: DrillOptions) -> dict[str, Any]:
    """Per window (phase or switch): requests by outcome, latency percentiles, what served them."""
    rows = []
    first_new: dict[str, float | None] = {}
    for k, w in enumerate(windows):
        rs = [r for r in records if w.start <= r.t0 < w.end]
        lat = sorted((r.t1 - r.t0) * 1e3 for r in rs if r.status is not None)
        served: dict[str, int] = {}
        for r in rs:
            if r.status == 200:
                key = f"{r.release}:{r.path}:{r.reason}"
                served[key] = served.get(key, 0) + 1
        row: dict[str, Any] = {
            "name": w.name, "seconds": round(w.end - w.start, 3), "requests": len(rs),
            "ok": sum(r.ok for r in rs),
            "failed": sum(1 for r in rs if r.status is not None and r.status != 200),
            "dropped": sum(1 for r in rs if r.status is None),
            "mismatched": sum(1 for r in rs if r.status == 200 and not r.ok),
            "latency_ms": _percentiles(lat), "throughput_rps": round(len(rs) / max(w.end - w.start, 1e-9), 1),
            "served_by": dict(sorted(served.items())),
            "errors": sorted({r.error for r in rs if r.error})[:10],
        }
        if w.expect_release is not None:
            row["expected"] = {"release": w.expect_release, "reference_only": w.expect_reference}
            row["stale"] = sum(1 for r in rs if r.status == 200 and not _as_expected(r, w))
        if w.switch:
            row["switch"] = w.switch
            nxt = windows[k + 1]
            hit = [r.t1 for r in records if r.t1 >= w.start and r.status == 200 and _as_expected(r, nxt)]
            first_new[w.name] = round(min(hit) - w.start, 4) if hit else None
            row["switch"]["first_answer_from_new_state_s"] = first_new[w.name]
        rows.append(row)
    totals = {k: sum(r[k] for r in rows) for k in ("requests", "ok", "failed", "dropped", "mismatched")}
    totals["stale"] = sum(r.get("stale", 0) for r in rows)
    switches_ok = all(r["switch"]["status"] == 200 and r["switch"]["result"] == "swapped" for r in rows
                      if "switch" in r)
    phases_loaded = all(r["requests"] > 0 for r in rows if "expected" in r)
    passed = ((totals["failed"] == totals["dropped"] == totals["mismatched"] == totals["stale"] == 0)
              and switches_ok and phases_loaded)
    return {
        "passed": passed, "release_new": new, "release_old": old, "server": url, "server_ready": ready,
        "totals": totals, "switches_ok": switches_ok, "every_phase_had_load": phases_loaded, "windows": rows,
        "requests": [{"op": s.op, "spec_id": s.spec_id, "dims": s.dims, "dtype": s.dtype, "bytes": s.nbytes}
                     for s in samples],
        "skipped_shapes": skipped,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"python": sys.version.split()[0], "pid": os.getpid()},
    }


def _as_expected(r: Record, w: Window) -> bool:
    if r.release != w.expect_release:
        return False
    return r.path == "reference" if w.expect_reference else True


def _percentiles(lat: list[float]) -> dict[str, float | None]:
    if not lat:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * (len(lat) - 1) + 0.5))], 3)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(lat[-1], 3),
            "mean": round(sum(lat) / len(lat), 3)}


def render_text(report: dict[str, Any]) -> str:
    t = report["totals"]
    lines = [
        f"tileship rollback drill: {'PASSED' if report['passed'] else 'FAILED'}   ({report['created']})",
        f"server {report['server']}  device: {report['server_ready'].get('device', '?')}",
        f"N = {report['release_new']}   N-1 = {report['release_old']}",
        f"requests {t['requests']}: ok {t['ok']}, failed {t['failed']}, dropped {t['dropped']}, wrong answers "
        f"{t['mismatched']}, "
        f"served by the wrong state {t['stale']}   (compile attempts at serve time: {report.get('compile_attempts')})",
        "",
        f"{'window':<26}{'s':>7}{'req':>7}{'req/s':>8}{'fail':>6}{'drop':>6}{'wrong':>6}{'stale':>6}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for w in report["windows"]:
        lat = w["latency_ms"]

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        lines.append(f"{w['name']:<26}{w['seconds']:>7.2f}{w['requests']:>7}{w['throughput_rps']:>8.1f}"
                     f"{w['failed']:>6}{w['dropped']:>6}{w['mismatched']:>6}{w.get('stale', '-'):>6}"
                     f"{f(lat['p50']):>9}{f(lat['p99']):>9}{f(lat['max']):>9}")
    lines += ["", "switches:"]
    for w in report["windows"]:
        if "switch" in w:
            s = w["switch"]
            first = s.get("first_answer_from_new_state_s")
            how = " (warm standby)" if s.get("warm") else ""
            lines.append(f"  {w['name']:<26} reload {s['status']} {s['result']}{how}: registry "
                         f"{s['registry_s'] * 1e3:.1f} "
                         f"ms, reload {s['reload_s'] * 1e3:.0f} ms "
                         f"(load {_ms(s.get('load_seconds'))}, warm-up {_ms(s.get('warmup_seconds'))}); first answer "
                         "from the new state after "
                         f"{'-' if first is None else f'{first * 1e3:.0f} ms'}"
                         + (f"; error: {s['error']}" if s.get("error") else ""))
    lines += ["", "served by (release:path:reason -> responses):"]
    for w in report["windows"]:
        if "expected" in w:
            lines.append(f"  {w['name']}: " + ", ".join(f"{k} x{v}" for k, v in w["served_by"].items()))
    lines += ["", f"request shapes ({len(report['requests'])}):"]
    lines += [f"  {r['spec_id']} {r['dims']} ({r['bytes'] / 1024:.0f} KiB)" for r in report["requests"]]
    if report["skipped_shapes"]:
        lines += [f"skipped (too large for --max-request-bytes): {len(report['skipped_shapes'])}"]
    errors = [e for w in report["windows"] for e in w["errors"]]
    if errors:
        lines += ["", "first errors:", *(f"  {e}" for e in errors[:10])]
    return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f} ms"


def write_report(out: Path, *, report: dict[str, Any] | None = None, metrics: str | None = None) -> None:
    """Write what is given into ``out``: ``drill.json`` and ``drill.txt`` from ``report``, ``metrics.txt`` from
    ``metrics`` (the server's ``/metrics``). Each is replaced whole (``atomic_file.write_file``): a drill killed at
    any instant leaves each file the previous drill's or this one's, never part of one. Raises OSError."""
    import json

    from tileship.release.atomic_file import write_file

    if metrics is not None:
        write_file(out / "metrics.txt", metrics)
    if report is not None:
        write_file(out / "drill.json", json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
        write_file(out / "drill.txt", render_text(report))
