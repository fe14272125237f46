"""Replay decision rules on one tune's evidence and judge each by served_vs_best runs (no GPU needed).

usage: python3 benchmarks/dev/tune_rules_replay.py VERIFICATION.json[.xz] SVB.json[.xz] [SVB.json ...]

For every tuned bucket the evidence keeps, per path and round, the latency clock's parts
(``clock_parts_us``: host as used, ``host_raw`` as timed, ``slowdown`` from the host gauge, device).
Each rule picks a path per bucket from those numbers (the reference unless a path is faster by
more than 2%):

    fastest   max(host scaled to the fastest probe, device)      (what ``--host-gauge`` does)
    median    max(host scaled to the run's median slowdown, device)
    raw       max(host as timed, device)                          (``--no-host-gauge``)
    device    device time alone
    headroom  max(host as used x 1.5, device)                     (a host 1.5x slower: replayed only)

A rule's score in one served_vs_best run is the number of buckets where its pick was within 1.05x
of the fastest path that run measured, and its worst ratio the largest (its pick) / (that path)
(``reference_us`` and ``kernels_us``; the dispatcher's own cost on the served path is left out, so
the scores are upper bounds).

Two yardsticks follow the rules: ``reference`` (cuBLAS everywhere) and ``hindsight``, the one table
that minimises each bucket's worst ratio over all the runs given, chosen after seeing them: no table
decided before the runs does better across them, so its worst ratio is the floor a static table can
reach on those runs.
"""

from __future__ import annotations

import json
import lzma
import statistics as st
import sys
from typing import Any

RULES = ("fastest", "median", "raw", "device", "headroom")
HEADROOM = 1.5


def load(path: str) -> Any:
    return json.load(lzma.open(path) if path.endswith(".xz") else open(path))


def pick(parts: dict[str, dict[str, list[float]]], rule: str, slowdown: float) -> str:
    lat = {}
    for c, x in parts.items():
        host, raw, dev = x["host"], x.get("host_raw", x["host"]), x["device"]
        if rule == "fastest":
            v = [max(h, d) for h, d in zip(host, dev, strict=True)]
        elif rule == "raw":
            v = [max(h, d) for h, d in zip(raw, dev, strict=True)]
        elif rule == "device":
            v = list(dev)
        elif rule == "headroom":
            v = [max(h * HEADROOM, d) for h, d in zip(host, dev, strict=True)]
        else:
            v = [max(h * slowdown, d) for h, d in zip(host, dev, strict=True)]
        lat[c] = st.median(v)
    best = min(lat, key=lambda c: lat[c])
    return best if lat[best] < 0.98 * lat["reference"] else "reference"


def main() -> None:
    ev, runs = load(sys.argv[1]), [load(p) for p in sys.argv[2:]]
    by_run = [{(r["group"], json.dumps(r["dims"], sort_keys=True)): r for r in run["rows"]} for run in runs]
    score = {rule: [0] * len(runs) for rule in RULES}
    worst = {rule: [1.0] * len(runs) for rule in RULES}
    n = 0
    for gid, g in ev["tuning"].items():
        slow = [s for p in g["points"] for x in p.get("clock_parts_us", {}).values() for s in x.get("slowdown", [])]
        median_slowdown = st.median(slow) if slow else 1.0
        for p in g["points"]:
            if not p.get("clock_parts_us"):
                continue
            n += 1
            key = (gid, json.dumps(p["dims"], sort_keys=True))
            for rule in RULES:
                choice = pick(p["clock_parts_us"], rule, median_slowdown)
                for i, rows in enumerate(by_run):
                    r = rows.get(key)
                    times = {} if r is None else {"reference": r["reference_us"], **r["kernels_us"]}
                    if choice in times and times[choice] <= 1.05 * min(times.values()):
                        score[rule][i] += 1
                    if choice in times:
                        worst[rule][i] = max(worst[rule][i], times[choice] / min(times.values()))
    print(f"{n} buckets; per rule, buckets within 1.05x of the fastest measured path in each run "
          f"({', '.join(sys.argv[2:])}), and the worst ratio of its pick to that path:")
    for rule, s in score.items():
        print(f"  {rule:8s} {s}, worst ratio {[round(w, 3) for w in worst[rule]]}")
    for name, within, worst in yardsticks(by_run):
        print(f"  {name:9s} within 1.05x {within}, worst ratio {[round(w, 3) for w in worst]}")


def yardsticks(by_run: list[dict[Any, Any]]) -> list[tuple[str, list[int], list[float]]]:
    """(name, buckets within 1.05x per run, worst ratio per run) of cuBLAS everywhere and of the hindsight table."""
    keys = set.intersection(*(set(r) for r in by_run))
    out = []
    for name in ("reference", "hindsight"):
        within, worst = [0] * len(by_run), [1.0] * len(by_run)
        for key in keys:
            times = [{"reference": r[key]["reference_us"], **r[key]["kernels_us"]} for r in by_run]
            best = [min(t.values()) for t in times]
            paths = set.intersection(*(set(t) for t in times))
            pick = "reference" if name == "reference" else min(
                sorted(paths), key=lambda c: max(t[c] / b for t, b in zip(times, best, strict=True)))
            for i, (t, b) in enumerate(zip(times, best, strict=True)):
                within[i] += t[pick] <= 1.05 * b
                worst[i] = max(worst[i], t[pick] / b)
        out.append((name, within, worst))
    return out


if __name__ == "__main__":
    main()
