"""Replay tune's winner rule (``verify.tune_rule``, this tree) on a tune's recorded round medians, and judge
the buckets whose decision it changes by served_vs_best runs (no GPU needed).

usage: python3 benchmarks/dev/tune_sign_replay.py VERIFICATION.json[.xz] [SVB.json[.xz] ...]

For every tuned bucket the evidence keeps each path's round medians (``round_medians_us``); the
rule is applied to them again as tune would now (``tune_rule._decide``: the band rule, then the
every-round rule). A bucket whose winner changes is printed with the recorded and the replayed
decision and, per served_vs_best run given, each side's measured time at that bucket's point (the
reference's ``reference_us``, a candidate's ``kernels_us``) and their ratio to that run's best path.
"""

from __future__ import annotations

import json
import lzma
import sys
from typing import Any

from tileship.verify.tune_rule import _decide


def load(path: str) -> Any:
    return json.load(lzma.open(path) if path.endswith(".xz") else open(path))


def main(argv: list[str]) -> int:
    ev = load(argv[0])
    runs = [load(p)["rows"] for p in argv[1:]]
    changed = total = 0
    for group, g in ev["tuning"].items():
        for p in g["points"]:
            if not p.get("candidates"):
                continue
            total += 1
            medians = {"": p["reference"]["round_medians_us"]}
            passed = {}
            for c, v in p["candidates"].items():
                passed[c] = {"k": v.get("failure")}
                if "round_medians_us" in v:
                    medians[c] = v["round_medians_us"]
            new = _decide(p["dims"], p["bucket"], medians, passed, "k")
            if new["winner"] == p["winner"]:
                continue
            changed += 1
            print(f"{group} bucket {p['bucket']}: recorded {p['winner'] or 'reference'} -> now "
                  f"{new['winner'] or 'reference'}\n    {new['why']}")
            for i, rows in enumerate(runs):
                for r in rows:
                    if r["group"] == group and p["bucket"][0] <= r["dims"][g["dynamic_dim"]] <= p["bucket"][1]:
                        old_us = r["reference_us"] if p["winner"] is None else r["kernels_us"].get(p["winner"])
                        new_us = r["reference_us"] if new["winner"] is None else r["kernels_us"].get(new["winner"])
                        print(f"    svb run {i} at {r['dims']}: best {r['best_us']:.1f} us ({r['best']}); recorded "
                              f"pick {old_us:.1f} ({old_us / r['best_us']:.3f}x), replayed pick {new_us:.1f} "
                              f"({new_us / r['best_us']:.3f}x)")
    print(f"{changed} of {total} tuned buckets change under this tree's rule")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
