"""What routing may assume of an evidence file's structure (``evidence.parse`` checks it once).

Routing reads evidence at load and, for a dynamic range, again on the request path
(``evidence.choice_at``, ``tuning.choice``). Evidence is not part of the release id and may be
unsigned, so a field of the wrong type must be refused when the file is read, naming the file
and the field, never found as a KeyError in a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.errors import BundleIntegrityError

_OPT_STR = (str, type(None))


class _Bad(Exception):
    def __init__(self, field: str, want: str) -> None:
        super().__init__(field, want)
        self.field, self.want = field, want


def _need(ok: bool, field: str, want: str) -> None:
    if not ok:
        raise _Bad(field, want)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _points(points: Any, field: str, dyn: Any, *, buckets: bool) -> None:
    _need(isinstance(points, list), field, "a list")
    for i, p in enumerate(points):
        where = f"{field}[{i}]"
        _need(isinstance(p, Mapping), where, "an object")
        dims = p.get("dims", {})
        _need(isinstance(dims, Mapping) and all(_int(v) for v in dims.values()), f"{where}.dims",
              "an object of integer sizes")
        if dyn is not None and not buckets and p.get("timing") is not None:
            _need(_int(dims.get(dyn)), f"{where}.dims.{dyn}", "an integer (the dynamic dim of a timed point)")
        timing = p.get("timing")
        _need(timing is None or (isinstance(timing, Mapping) and isinstance(timing.get("verdict"), _OPT_STR)),
              f"{where}.timing", "null or an object with a string verdict")
        _need(isinstance(p.get("winner"), _OPT_STR), f"{where}.winner", "a candidate id or null")
        if buckets and dyn is not None:
            b = p.get("bucket")
            _need(isinstance(b, list) and len(b) == 2 and all(_int(v) for v in b), f"{where}.bucket",
                  "[first, last] sizes")


def _check(data: Mapping[str, Any]) -> None:
    for key in ("device", "host"):
        _need(isinstance(data.get(key), (Mapping, type(None))), key, "an object or null")
    for key in ("lock_digest", "release_id"):
        _need(isinstance(data.get(key), _OPT_STR), key, "a string or null")
    for sid, entry in data["specializations"].items():
        where = f"specializations.{sid}"
        _need(isinstance(entry, Mapping), where, "an object")
        _need(isinstance(entry.get("passed", False), bool), f"{where}.passed", "true or false")
        for key in ("route", "dynamic_dim", "device_type"):
            _need(isinstance(entry.get(key), _OPT_STR), f"{where}.{key}", "a string or null")
        _points(entry.get("points", []), f"{where}.points", entry.get("dynamic_dim"), buckets=False)
    tuning = data.get("tuning")
    _need(isinstance(tuning, (Mapping, type(None))), "tuning", "an object or null")
    for gid, group in (tuning or {}).items():
        where = f"tuning.{gid}"
        _need(isinstance(group, Mapping), where, "an object")
        for key in ("target", "dynamic_dim"):
            _need(isinstance(group.get(key), _OPT_STR), f"{where}.{key}", "a string or null")
        cands = group.get("candidates") or []
        _need(isinstance(cands, list) and all(isinstance(c, str) for c in cands), f"{where}.candidates",
              "a list of candidate ids")
        _points(group.get("points") or [], f"{where}.points", group.get("dynamic_dim"), buckets=True)
        failed = group.get("failed")  # absent in evidence written before tune recorded failed groups
        _need(failed is None or (isinstance(failed, Mapping) and isinstance(failed.get("reason"), str)
                                 and isinstance(failed.get("dims"), Mapping)
                                 and all(_int(v) for v in failed["dims"].values())),
              f"{where}.failed", "null or an object with integer dims and a string reason")


def check(data: Mapping[str, Any], path: Path) -> None:
    """Raise BundleIntegrityError naming ``path`` and the first field of the wrong type."""
    try:
        _check(data)
    except _Bad as bad:
        raise BundleIntegrityError(f"{path}: malformed evidence: {bad.field} must be {bad.want}", path=str(path),
                                   hint="re-run `tileship verify` on the release") from None
