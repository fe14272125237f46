"""``release.json`` read as hostile input: what the loader may assume of its structure.

The file is hashed (and signed when keys are trusted), but an unsigned release may be hand-made:
a field of the wrong type must be refused naming the file and the field, never surface as a
KeyError or AttributeError from the middle of ``load``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.declare.dims import SAME
from tileship.declare.parts import DTYPES
from tileship.errors import BundleIntegrityError
from tileship.release import strict_json


def _bad(path: Path, field: str, want: str) -> BundleIntegrityError:
    return BundleIntegrityError(f"{path}: malformed release description: {field} must be {want}", path=str(path),
                                hint="release.json is written by `tileship build`; rebuild the release")


def _tensors(path: Path, field: str, value: Any) -> None:
    if not (isinstance(value, list) and all(isinstance(t, list) and len(t) >= 2 and isinstance(t[0], str)
                                            and isinstance(t[1], list) for t in value)):
        raise _bad(path, field, "a list of [name, dims, ...] entries")


def read(path: Path) -> dict[str, Any]:
    """``release.json`` at ``path``, its structure checked. Raises BundleIntegrityError naming the
    file and the first field of the wrong type (the interpreting code, ``tuning.groups`` and
    ``loader.op_shape``, runs on it next: the caller translates what those refuse)."""
    rel = strict_json.read(path, "release description")  # never blocks on a FIFO, never reads without end
    if not isinstance(rel, dict):
        raise _bad(path, "the file", "a JSON object")
    for key, kind, want in (("operators", dict, "an object"), ("specializations", dict, "an object"),
                            ("kernel_revision", str, "a string"), ("model", dict, "an object")):
        if not isinstance(rel.get(key), kind):
            raise _bad(path, key, want)
    if not isinstance(rel.get("policy", {}), dict):
        raise _bad(path, "policy", "an object")
    for key, value in rel.get("policy", {}).items():
        if not isinstance(value, (str, bool)):
            raise _bad(path, f"policy.{key}", "a string or true/false")
    for name, desc in rel["operators"].items():
        if not isinstance(desc, Mapping):
            raise _bad(path, f"operators.{name}", "an object")
        if not isinstance(desc.get("reference"), str):
            raise _bad(path, f"operators.{name}.reference", "a module.function string")
        for key in ("inputs", "outputs"):
            _tensors(path, f"operators.{name}.{key}", desc.get(key))
        for key in ("sample", "cost"):
            if not isinstance(desc.get(key), (str, type(None))):
                raise _bad(path, f"operators.{name}.{key}", "a module.function string or null")
        for key in ("sources", "scalars", "mutates", "candidates"):
            if not isinstance(desc.get(key) or [], list):
                raise _bad(path, f"operators.{name}.{key}", "a list")
        for key in ("tensor_dtypes", "reference_imports"):
            if not isinstance(desc.get(key) or {}, Mapping):
                raise _bad(path, f"operators.{name}.{key}", "an object")
        for tensor, dtype in (desc.get("tensor_dtypes") or {}).items():
            if dtype != SAME and dtype not in DTYPES:
                raise _bad(path, f"operators.{name}.tensor_dtypes.{tensor}", f'"same" or one of {", ".join(DTYPES)}')
    for sid, info in rel["specializations"].items():
        if not (isinstance(info, Mapping) and isinstance(info.get("status"), str)
                and isinstance(info.get("spec"), Mapping)):
            raise _bad(path, f"specializations.{sid}", "an object with a string status and a spec object")
        if info["spec"].get("op") not in rel["operators"]:
            raise _bad(path, f"specializations.{sid}.spec.op", "the name of a described operator")
    return rel
