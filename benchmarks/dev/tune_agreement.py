"""Do two tune runs route every bucket the same way? (development, issue 13)

    python benchmarks/dev/tune_agreement.py A/verification.json[.xz] B/verification.json[.xz]

Compares the tuning tables of two evidence files of one build (the same groups and buckets),
bucket by bucket: the winner (a candidate id, or the reference), and for the buckets where they
differ, the reference's and the winners' times in each run. Prints the agreement and the
disagreements; exit 0.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path
from typing import Any


def _read(path: str) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    return json.loads(lzma.decompress(raw) if path.endswith(".xz") else raw)


def _us(point: dict[str, Any], who: str | None) -> float | None:
    entry = point["reference"] if who is None else point["candidates"].get(who, {})
    return entry.get("median_us")


def main(argv: list[str]) -> int:
    a, b = (_read(p)["tuning"] for p in argv[:2])
    same = total = 0
    rows = []
    for gid in sorted(set(a) & set(b)):
        pb = {json.dumps(p["dims"], sort_keys=True): p for p in b[gid]["points"]}
        for p in a[gid]["points"]:
            q = pb.get(json.dumps(p["dims"], sort_keys=True))
            if q is None:
                continue
            total += 1
            if p["winner"] == q["winner"]:
                same += 1
                continue
            dims = ",".join(f"{k}={v}" for k, v in p["dims"].items())
            rows.append(f"  {gid} @ {dims}: A {p['winner'] or 'reference'} (ref {_us(p, None):.1f}, won "
                        f"{_us(p, p['winner']) or _us(p, None):.1f} us) | B {q['winner'] or 'reference'} "
                        f"(ref {_us(q, None):.1f}, won {_us(q, q['winner']) or _us(q, None):.1f} us)")
    print(f"{same}/{total} buckets routed the same way ({argv[0]} vs {argv[1]})")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
