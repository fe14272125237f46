"""The reference is pinned: the Python an operator's fallback runs is hashed at build and compared
with what this process imports, at load, verify, tune and ``tileship check``.

At build, ``pin(op, shipped)`` hashes, per operator, every module the reference path runs from:
the module declaring the operator, the reference's and the sample hook's modules, and every
local module shipped in the release (``sources/``). The lock records them as
``reference_modules: {operator: {module: sha256}}`` (and ``release.json`` beside each operator).
A shipped module's pin is the digest of the very bytes copied into ``sources/`` (the manifest
hashes that copy too); an installed module (the built-in catalog) is pinned by the file the
build imported.

At load the loader puts the release's ``sources/`` first on ``sys.path`` and imports the
reference; ``compare`` then hashes the file each pinned module was actually imported from
(``sys.modules[name].__file__``, else where the import system would find it). A difference is
*blocking* reference drift: the fallback changed since verification, so "serve the reference"
is no longer the tested answer; ``require`` raises ``ReferenceDrift`` naming the operator, the
module and the file, under every drift policy, unless reference drift is explicitly allowed
(``allow_reference_drift=True``, ``TILESHIP_ALLOW_REFERENCE_DRIFT=1``). See docs/verification.md.

Why compare rather than only import from the bundle's copy: a module already in ``sys.modules``
(a server that imported its project package, a second release of the same project loaded in
one process, an installed catalog module that is never shipped) is used as it is, whatever
``sys.path`` says; only a hash of what was imported says whether it is the verified code.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tileship.build.lock import Difference, sha256_file
from tileship.errors import ReferenceDrift

#: the lock key (and release.json operator key) holding the pins
KEY = "reference_modules"
CONSEQUENCE = ("the fallback changed since verification: the reference no longer runs the code the release was "
               "verified with")


def module_name(bundle_path: str) -> str:
    """``pkg/mod.py`` -> ``pkg.mod``; ``pkg/__init__.py`` -> ``pkg`` (the inverse of ``module_relative``)."""
    parts = bundle_path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _origin(name: str) -> Path | None:
    """The file module ``name`` runs from in this process, or would be imported from; None when
    it cannot be located (or is not a source file). Never executes the module itself (its parent
    packages may be imported to find it)."""
    mod = sys.modules.get(name)
    file = getattr(mod, "__file__", None) if mod is not None else None
    if file is None and mod is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        file = spec.origin if spec is not None and spec.has_location else None
    return Path(file).resolve() if file and str(file).endswith(".py") else None


def pin(op: Any, shipped: Iterable[str]) -> dict[str, str]:
    """module -> sha256 of its file, for every module ``op``'s reference path runs from (see the
    module docstring). Modules of the standard library, and third-party ones (pinned by version in
    ``reference_imports``), are not pinned."""
    names = {module_name(p) for p in shipped}
    names.update(m for m in (op.module, getattr(op.reference, "__module__", None),
                             getattr(op.sample, "__module__", None) if op.sample is not None else None) if m)
    out: dict[str, str] = {}
    for name in sorted(names):
        if name.partition(".")[0] in sys.stdlib_module_names or name == "__main__":
            continue
        file = _origin(name)
        if file is not None:
            out[name] = sha256_file(file)
    return out


def compare(pins: Mapping[str, Mapping[str, str]], only: Iterable[str] | None = None) -> tuple[Difference, ...]:
    """Differences between the pinned modules and the files this process imports them from.

    A module whose file differs: blocking (``reference.<operator>.<module>``). A module that cannot
    be located from here: informational (the loader imports references before comparing, so at
    load a missing reference has already failed, naming it).
    """
    wanted = set(only) if only is not None else None
    out: list[Difference] = []
    for op in sorted(pins):
        if wanted is not None and op not in wanted:
            continue
        for name, digest in sorted(pins[op].items()):
            file = _origin(name)
            field = f"reference.{op}.{name}"
            if file is None:
                out.append(Difference(field, digest, None, False,
                                      "module cannot be located from this process: not compared (load imports it "
                                      "from the release's sources, or fails naming it)"))
                continue
            try:
                current = sha256_file(file)
            except OSError:  # imported, then its file went away (a closed snapshot): it cannot be confirmed
                out.append(Difference(field, digest, None, True,
                                      f"{file}, which this process imported it from, is gone: it cannot be "
                                      "confirmed to be the code the release was verified with"))
                continue
            if current != digest:
                out.append(Difference(field, digest, current, True,
                                      f"{file} differs from the pinned copy: {CONSEQUENCE}"))
    return tuple(out)


def lock_pins(lock: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The lock's pins; empty for a lock written before references were pinned."""
    raw = lock.get(KEY) or {}
    return {str(op): dict(mods) for op, mods in raw.items() if isinstance(mods, Mapping)}


def require(lock: Mapping[str, Any], operators: Iterable[str], *, allow: bool = False) -> tuple[Difference, ...]:
    """Compare the pins of ``operators`` (their references already imported). Returns the blocking
    differences (empty when none). Raises ReferenceDrift naming the first operator, module and file
    unless ``allow``; then the caller notes the differences instead."""
    drift = tuple(d for d in compare(lock_pins(lock), operators) if d.blocking)
    if drift and not allow:
        raise drift_error(drift)
    return drift


def drift_error(drift: tuple[Difference, ...]) -> ReferenceDrift:
    from tileship.build.lock import DriftReport

    first = drift[0]
    _, op, module = first.field.split(".", 2)
    more = f" (and {len(drift) - 1} more: {', '.join(d.field for d in drift[1:4])})" if len(drift) > 1 else ""
    return ReferenceDrift(
        f"reference drift: operator {op!r}, module {module}: {first.consequence}{more}",
        operator=op, module=module, report=DriftReport(drift),
        hint="restore the module the release was built from, or rebuild and re-verify with the new reference; "
             "to serve anyway set TILESHIP_ALLOW_REFERENCE_DRIFT=1 (load(allow_reference_drift=True))")
