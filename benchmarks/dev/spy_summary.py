"""The top frames of a py-spy raw profile (``py-spy record -f raw``): own and inclusive shares of the samples.

    python benchmarks/dev/spy_summary.py PROFILE.txt [--top 30]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    total, own, incl, threads = 0, collections.Counter[str](), collections.Counter[str](), collections.Counter[str]()
    for line in a.profile.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        total += int(n)
        if frames[0].startswith(("thread (", "process ")):  # py-spy --threads: the thread (and process) first
            threads[frames[0]] += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    print(f"{total} samples")
    for title, counts in (("threads", threads), ("own", own), ("inclusive", incl)):
        print(f"-- {title}")
        for f, n in counts.most_common(a.top):
            print(f"{n / total:6.1%}  {f[:160]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
