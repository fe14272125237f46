"""The files ``tileship propose`` reads, as hostile input: the telemetry dump and a release's ``build-log.json``.

Either may come from anywhere (a saved ``GET /v2/tileship/telemetry``, a copied release). ``json.loads`` on
``Path.read_text`` blocks forever on a FIFO, reads without end from a symlink to ``/dev/zero``, escapes a deep
nesting as RecursionError, and lets a field of the wrong type through to the arithmetic of ``propose`` as a
TypeError. Here each file is read as a regular file of bounded size (``small_file``), parsed strictly
(``strict_json``) and its fields checked once: anything else is a DeclarationError naming the file and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.errors import DeclarationError

#: a telemetry dump holds at most ROW_LIMIT rows per operator: megabytes, not more
READ_LIMIT = 64 << 20
#: the largest call count or size accepted (a 64-bit counter)
MAX_COUNT = (1 << 63) - 1
#: the largest seconds total accepted (about 30 000 years)
MAX_SECONDS = 1e12
#: compile seconds assumed per specialization when no build record is given
DEFAULT_COMPILE_SECONDS = 60.0


class _Bad(Exception):
    def __init__(self, field: str, want: str) -> None:
        super().__init__(field, want)
        self.field, self.want = field, want


def _read(path: Path, what: str) -> Any:
    from tileship.release import small_file, strict_json

    try:
        body = small_file.read(Path(path), READ_LIMIT)
    except OSError as exc:
        raise DeclarationError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    return strict_json.loads(body, path, what, error=DeclarationError)


def _count(v: Any, field: str) -> int:
    if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT):
        raise _Bad(field, f"an integer from 0 to {MAX_COUNT}")
    return v


def _seconds(v: Any, field: str) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS):
        raise _Bad(field, f"a number of seconds from 0 to {MAX_SECONDS:g}")
    return float(v)


def _obj(v: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _Bad(field, "an object")
    return v


def _stats(v: Any, field: str) -> None:
    o = _obj(v, field)
    _count(o.get("calls"), f"{field}.calls")
    _seconds(o.get("seconds"), f"{field}.seconds")


def _row(r: Any, field: str) -> None:
    row = _obj(r, field)
    _stats(row, field)
    if not isinstance(row.get("reason"), str):
        raise _Bad(f"{field}.reason", "a string")
    for d, size in _obj(row.get("dims", {}), f"{field}.dims").items():
        _count(size, f"{field}.dims.{d}")
    shapes = row.get("shapes", [])
    if not isinstance(shapes, list):
        raise _Bad(f"{field}.shapes", "a list of shapes")
    for i, s in enumerate(shapes):
        if not isinstance(s, list):
            raise _Bad(f"{field}.shapes[{i}]", "a list of sizes")
        for j, size in enumerate(s):
            _count(size, f"{field}.shapes[{i}][{j}]")


def _check_telemetry(data: Any) -> None:
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("ops"), dict):
        raise _Bad("", "a schema-1 telemetry dump")
    for name, t in data["ops"].items():
        where = f"ops.{name}"
        op = _obj(t, where)
        if not isinstance(op.get("rows"), list):
            raise _Bad(f"{where}.rows", "a list of rows")
        for i, r in enumerate(op["rows"]):
            _row(r, f"{where}.rows[{i}]")
        other = _obj(op.get("other"), f"{where}.other")
        _stats(other, f"{where}.other")
        for reason, o in _obj(other.get("reasons", {}), f"{where}.other.reasons").items():
            _stats(o, f"{where}.other.reasons.{reason}")
        _count(op.get("kernel_calls", 0), f"{where}.kernel_calls")


def read_telemetry(path: Path) -> dict[str, Any]:
    """A telemetry JSON file (format in ``tileship.runtime.telemetry``), checked. Raises DeclarationError
    naming the file (and the field) when it is not a regular readable file of at most READ_LIMIT bytes, not
    JSON, or not a schema-1 dump whose counts, seconds and sizes are numbers in range. Never blocks."""
    data = _read(path, "telemetry JSON")
    try:
        _check_telemetry(data)
    except _Bad as bad:
        where = f"{bad.field} must be " if bad.field else "not "
        raise DeclarationError(f"{path}: {where}{bad.want}",
                               hint="save GET /v2/tileship/telemetry or release.telemetry() as JSON") from None
    return data


def compile_seconds(release: Path | None) -> tuple[dict[str, float], float, str]:
    """(per-operator mean, overall mean, source) of compile seconds from ``release``/build-log.json (the
    default per specialization when there is none). Raises DeclarationError naming the file and field when
    it is not a build log (unreadable, not JSON, a field of the wrong type)."""
    default: tuple[dict[str, float], float, str] = ({}, DEFAULT_COMPILE_SECONDS,
                                                    f"default {DEFAULT_COMPILE_SECONDS:g} s per specialization")
    path = Path(release) / "build-log.json" if release is not None else None
    if path is None or not (path.exists() or path.is_symlink()):
        return default
    log = _read(path, "build log")
    by_op: dict[str, list[float]] = {}
    try:
        for sid, rec in sorted(_obj(_obj(log, "").get("specializations", {}), "specializations").items()):
            rec = _obj(rec, f"specializations.{sid}")
            if not isinstance(rec.get("ok", False), bool):
                raise _Bad(f"specializations.{sid}.ok", "true or false")
            if rec.get("ok"):
                by_op.setdefault(sid.split(".", 1)[0], []).append(_seconds(rec.get("seconds"),
                                                                            f"specializations.{sid}.seconds"))
    except _Bad as bad:
        raise DeclarationError(f"{path}: {bad.field + ' must be ' if bad.field else 'must be '}{bad.want}",
                               hint="pass the release directory `tileship build` wrote, or leave --release out") \
            from None
    every = [s for v in by_op.values() for s in v]
    if not every:
        return default
    return ({op: sum(v) / len(v) for op, v in by_op.items()}, sum(every) / len(every),
            f"mean compile seconds of {release}/build-log.json")


__all__ = ["DEFAULT_COMPILE_SECONDS", "READ_LIMIT", "compile_seconds", "read_telemetry"]
