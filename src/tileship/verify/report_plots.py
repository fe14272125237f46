"""The report's two plots of an operator, one bar per verified shape (``report.rows_for``'s rows).

``plot_speedup``: reference time / kernel time (log scale), whiskers from the noise band, each bar colored by
the path the routing policy takes there. ``plot_error``: the worst element's share of the tolerance, the kernel's
bars and the reference's own as markers; a shape that failed with NaN/Inf or unwritten elements is a full-height
hatched bar with a label. Each writes one PNG through matplotlib's Agg canvas (matplotlib is imported inside
the function); nothing here reads the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KERNEL_COLOR = "#1b9e77"
REFERENCE_COLOR = "#d95f02"
FAILED_COLOR = "#b2182b"
UNTIMED_COLOR = "#999999"


def _bar_color(row: Mapping[str, Any], policy: str) -> str:
    if row["passed"] is False:
        return FAILED_COLOR
    if not row["timing"]:
        return UNTIMED_COLOR
    return KERNEL_COLOR if row[policy][0] == "kernel" else REFERENCE_COLOR


def _group_axis(ax: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.get("short", r["dims"]) for r in rows], rotation=60, ha="right", fontsize=7)
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i]["spec_id"] != rows[start]["spec_id"]:
            if i < len(rows):
                ax.axvline(i - 0.5, color="#cccccc", lw=0.8)
            ax.text((start + i - 1) / 2, 1.01, rows[start]["label"], transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=7)
            start = i


def plot_speedup(rows: Sequence[Mapping[str, Any]], path: Path, *, policy: str, title: str) -> None:
    """Bars of reference time / kernel time per shape (log scale; > 1: the kernel is faster),
    whiskers from the noise band, colored by the path ``policy`` takes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(min(30.0, max(7.0, 0.32 * len(rows) + 2.5)), 3.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    vals, lo, hi = [], [], []
    for r in rows:
        t = r["timing"]
        if not t or not t["kernel"]["median_us"]:
            vals.append(math.nan)
            lo.append(0.0)
            hi.append(0.0)
            continue
        k, ref, noise = t["kernel"]["median_us"], t["reference"]["median_us"], t.get("noise_us") or 0.0
        s = ref / k
        vals.append(s)
        lo.append(max(0.0, s - max(ref - noise, 1e-9) / (k + noise)))
        hi.append(max(0.0, (ref + noise) / max(k - noise, 1e-9) - s))
    ax.bar(range(len(rows)), [0.0 if math.isnan(v) else v for v in vals], yerr=[lo, hi],
           color=[_bar_color(r, policy) for r in rows], ecolor="#333333", capsize=2, width=0.7)
    ax.axhline(1.0, color="#333333", lw=1, ls="--")
    finite = [v for v in vals if not math.isnan(v) and v > 0]
    if finite:
        ax.set_yscale("log")
        ax.set_ylim(min(min(finite) / 1.5, 0.5), max(max(finite) * 1.5, 2.0))
    ax.set_ylabel("reference time / kernel time")
    ax.set_title(title, fontsize=10, pad=16)
    _group_axis(ax, rows)
    ax.legend(handles=[Patch(color=KERNEL_COLOR, label=f"kernel serves ({policy})"),
                       Patch(color=REFERENCE_COLOR, label=f"reference serves ({policy})"),
                       Patch(color=FAILED_COLOR, label="failed verification"),
                       Patch(color=UNTIMED_COLOR, label="not timed")],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)


def _failure_kind(row: Mapping[str, Any]) -> str | None:
    """A short label for a failed shape whose error is not a number (drawn above the plot)."""
    text = row.get("failure") or ""
    if row["passed"] is not False:
        return None
    for needle, label in (("never written", "unwritten"), ("NaN/Inf", "NaN/Inf"), ("raised", "raised"),
                          ("poisoned", "no poison")):
        if needle in text:
            return label
    return None


def plot_error(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> None:
    """Worst element's |err| / (atol + rtol |ref|) per shape (<= 1 passes), kernel bars and
    the reference's own (in the served dtype) as markers, log scale. Shapes that failed with
    NaN/Inf or unwritten elements get a full-height hatched bar and a label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(min(30.0, max(7.0, 0.32 * len(rows) + 2.5)), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    floor, top = 1e-4, 10.0
    kinds = [_failure_kind(r) for r in rows]
    kern = [top if kind else (max(floor, r["point"].get("tol_ratio") or floor) if r["passed"] is not None else math.nan)
            for r, kind in zip(rows, kinds, strict=True)]
    refs = [max(floor, r["point"].get("reference_tol_ratio") or floor) if r["passed"] is not None else math.nan
            for r in rows]
    top = max(top, *[v * 2 for v in kern if not math.isnan(v)])
    bars = ax.bar(range(len(rows)), [0.0 if math.isnan(v) else v for v in kern], width=0.7, label="kernel",
                  color=[FAILED_COLOR if r["passed"] is False else "#4c78a8" for r in rows])
    for bar, kind in zip(bars, kinds, strict=True):
        if kind:
            bar.set_hatch("///")
            ax.text(bar.get_x() + bar.get_width() / 2, 2e-3, kind, ha="center", va="bottom", fontsize=7, color="white",
                    fontweight="bold", rotation=90)
    ax.scatter(range(len(rows)), refs, marker="_", s=160, color="#222222", zorder=3, label="reference (its dtype)")
    ax.axhline(1.0, color=FAILED_COLOR, lw=1, ls="--", label="tolerance")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top)
    ax.set_ylabel("worst |err| / (atol + rtol|ref|)")
    ax.set_title(title, fontsize=10, pad=16)
    _group_axis(ax, rows)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)
