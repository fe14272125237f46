"""The report's roofline section of one operator: a plot against the measured ceilings and a table.

Each timed shape of an operator that declares a cost model is a point at its arithmetic
intensity (flops / bytes): the kernel filled, the reference hollow, under the roof
min(peak FLOP/s, intensity x peak bytes/s) of the device verify ran on. The table names the
bound of each shape and how far each path is from it (its share of that bound's ceiling).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def points_of(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """(spec id, evidence entry) pairs -> one row per point that has a roofline."""
    rows = []
    for sid, entry in entries:
        for p in entry.get("points", []):
            rf = p.get("roofline")
            if rf and "error" not in rf:
                rows.append({"spec": sid, "dtype": entry.get("dtype"), "device": entry.get("device_type"),
                             "dims": p["dims"], **rf})
    return rows


def _plot(op: str, rows: Sequence[Mapping[str, Any]], ceilings: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.8), dpi=100)
    xs = [r["intensity"] for r in rows]
    lo, hi = max(min(xs) / 4, 1e-3), max(max(xs) * 4, 1.0)
    for dev, ceil in sorted(ceilings.items()):
        peak_b = ceil["bytes_per_s"]
        for dt, peak_f in sorted(ceil["flops_per_s"].items()):
            grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
            ax.plot(grid, [min(peak_f, x * peak_b) for x in grid], lw=1, alpha=0.6,
                    label=f"{dev} roof ({dt}: {peak_f / 1e12:.1f} TFLOP/s, {peak_b / 1e12:.2f} TB/s)")
    styles: tuple[tuple[str, dict[str, Any]], ...] = (
        ("kernel", {"marker": "o", "color": "tab:blue"}),
        ("reference", {"marker": "o", "facecolors": "none", "edgecolors": "tab:orange"}))
    for name, style in styles:
        pts = [(r["intensity"], r[name]["flops_per_s"]) for r in rows if name in r]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=22, label=name, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{op}: roofline of the verified shapes")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def section(op: str, entries: Sequence[tuple[str, Mapping[str, Any]]], ceilings: Mapping[str, Any] | None,
            dest: Path) -> str:
    """The HTML of the roofline section (empty when nothing of ``op`` has a roofline)."""
    rows = points_of(entries)
    if not rows or not ceilings:
        return ""
    png = f"{op}-roofline.png"
    _plot(op, rows, ceilings, dest / png)
    body = []
    for r in sorted(rows, key=lambda r: (r["spec"], sorted(r["dims"].items()))):
        dims = ", ".join(f"{k}={v}" for k, v in r["dims"].items())
        k, ref = r.get("kernel", {}), r.get("reference", {})
        body.append(f"<tr><td>{html.escape(r['spec'])}</td><td>{html.escape(dims)}</td><td>{r['intensity']:.3g}</td>"
                    f"<td>{html.escape(r['bound'])}</td>"
                    f"<td>{k.get('pct_of_bound', 0):.1f}%</td><td>{ref.get('pct_of_bound', 0):.1f}%</td>"
                    f"<td>{k.get('bytes_per_s', 0) / 1e12:.3g} TB/s, "
                    f"{k.get('flops_per_s', 0) / 1e12:.3g} TFLOP/s</td></tr>")
    head = ("<tr><th>specialization</th><th>shape</th><th>FLOP/byte</th><th>bound</th>"
            "<th>kernel, share of the bound</th><th>reference, share of the bound</th><th>kernel achieved</th></tr>")
    worst = min(rows, key=lambda r: r.get("kernel", {}).get("pct_of_bound", 0))
    method = next(iter(ceilings.values()))["method"]
    note = (f"<p class='muted'>Ceilings measured by verify on this device ({html.escape(method)}). "
            f"Farthest from its bound: {html.escape(worst['spec'])} at "
            f"{worst.get('kernel', {}).get('pct_of_bound', 0):.1f}% of its {html.escape(worst['bound'])} ceiling.</p>")
    return (f"<img src='{html.escape(png)}' alt='{html.escape(op)} roofline'>" + note
            + f"<table>{head}{''.join(body)}</table>")
