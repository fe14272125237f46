"""What a reader may assume of a lock's structure (``read_lock`` checks it once).

A lock travels inside a release, which may be hand-made: a section of the wrong type must be
refused as a malformed lock naming the file and the field, not found later as an AttributeError
deep in drift comparison or reference pinning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.errors import LockError

_SCALAR = (str, int, float, bool, type(None))
#: section -> (required?, what it must be); "map" a mapping, "str_map" a mapping of scalars,
#: "map_of_maps" a mapping whose values are mappings (of scalars)
_SECTIONS: dict[str, tuple[bool, str]] = {
    "framework": (True, "str_map"), "backend": (True, "map"), "device_arch": (True, "map"),
    "kernel_revision": (True, "str"), "reference_modules": (False, "map_of_maps"),
    "reference_imports": (False, "map_of_maps"), "kernel_sources": (False, "str_map"),
    "shapes": (False, "map_of_maps"), "fallback": (False, "str_map"), "model": (False, "str_map"),
    "image_digest": (False, "str"), "toolchain": (False, "map"),
}


def _bad(path: Path, field: str, want: str, got: Any) -> LockError:
    return LockError(f"{path}: malformed lock: {field} must be {want}, not {type(got).__name__}",
                     hint="a lock is written by `tileship lock` / `tileship build`; rebuild the release")


def _scalars(path: Path, field: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise _bad(path, field, "a mapping", value)
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, _SCALAR):
            raise _bad(path, f"{field}.{k}", "a string, number or null", v)


def check(data: Mapping[str, Any], path: Path) -> None:
    """Raise LockError naming ``path`` and the field when a section has the wrong type."""
    for key, (required, kind) in _SECTIONS.items():
        if key not in data:
            if required:
                raise LockError(f"{path} lacks {key!r}")
            continue
        value = data[key]
        if value is None and (not required or key == "device_arch"):
            continue
        if kind == "str" and not isinstance(value, str):
            raise _bad(path, key, "a string", value)
        if kind == "str_map":
            _scalars(path, key, value)
        if kind in ("map", "map_of_maps") and not isinstance(value, Mapping):
            raise _bad(path, key, "a mapping", value)
        if kind == "map_of_maps":
            for name, inner in value.items():
                if not isinstance(inner, Mapping):
                    raise _bad(path, f"{key}.{name}", "a mapping", inner)
    backend, arch = data["backend"], data["device_arch"] or {}
    for k, v in backend.items():
        if k == "tilelang_native_libs" and v is not None:
            _scalars(path, f"backend.{k}", v)
        elif k != "tilelang_native_libs" and not isinstance(v, _SCALAR):
            raise _bad(path, f"backend.{k}", "a string, number or null", v)
    if arch.get("gpu") is not None:
        _scalars(path, "device_arch.gpu", arch["gpu"])
    targets = arch.get("targets", [])
    if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise _bad(path, "device_arch.targets", "a list of target names", targets)
    for op, mods in (data.get("reference_modules") or {}).items():
        _scalars(path, f"reference_modules.{op}", mods)
