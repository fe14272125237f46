"""The Python a release's operators run: where it is imported from and whether it is the pinned code.

``use_sources`` puts the release's shipped ``sources/`` first on ``sys.path``;
``forget_other_releases`` drops modules another loaded release shipped under the same names, so
each release imports its own copies; ``import_references`` imports every operator's reference
and compares the pinned modules (``build.pins``) with what was imported. Used by ``load``,
``verify`` and ``tune``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tileship.build import pins
from tileship.errors import ArtifactLoadError, CompileForbidden


def import_references(operators: Mapping[str, dict[str, Any]], lock: Mapping[str, Any], src: Path, *,
                      allow_drift: bool) -> tuple[dict[str, Any], list[str]]:
    """(operator -> its reference, notes) for a release whose ``sources`` (``src``) are first on
    ``sys.path``. Raises ArtifactLoadError for a reference that cannot be imported, ReferenceDrift
    when a pinned module differs unless ``allow_drift`` (then each difference is a note)."""
    forget_other_releases((m for d in operators.values() for m in d.get("sources") or ()), src)
    references = {name: import_reference(desc, name) for name, desc in sorted(operators.items())}
    drift = pins.require(lock, references, allow=allow_drift)
    return references, [f"reference drift allowed ({d.field}): {d.consequence}" for d in drift]


def import_sample(desc: dict[str, Any], name: str) -> Any:
    """The operator's ``sample`` hook, or None when it declares none."""
    return import_callable(desc["sample"], name, "sample hook") if desc.get("sample") else None


def use_sources(root: Path) -> Path | None:
    """Put the release's shipped operator sources (``<release>/sources``) first on ``sys.path``,
    so references import from the release itself; None when the release ships none."""
    src = root / "sources"
    if not src.is_dir():
        return None
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return src


def forget_other_releases(shipped: Iterable[str], src: Path) -> list[str]:
    """Drop from ``sys.modules`` the shipped modules (bundle paths ``shipped``) that this process
    imported from *another* loaded release's snapshot, so this release imports its own copies from
    ``src`` (a hot swap to a new version of the same project would otherwise run the old reference,
    which the pins would then refuse). The release loaded before keeps the functions it holds.
    Modules imported from anywhere else (the project itself, an installed package) are left alone:
    the pins say whether they are the verified code. Returns the names dropped."""
    dropped = []
    for name in sorted({pins.module_name(p) for p in shipped}):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        path = Path(file)
        if any(part.startswith("tileship-snapshot-") for part in path.parts) and not path.is_relative_to(src):
            del sys.modules[name]
            dropped.append(name)
    if dropped:
        importlib.invalidate_caches()
    return dropped


def import_reference(desc: dict[str, Any], name: str) -> Any:
    return import_callable(desc["reference"], name, "reference", desc)


def import_callable(path: str, name: str, what: str, desc: dict[str, Any] | None = None) -> Any:
    """Import ``module.qualname``. Raises ArtifactLoadError naming a missing module (and, for a
    third-party one, the version the build had) and where it was looked for; nothing else escapes."""
    module, _, qual = path.rpartition(".")
    try:
        mod = importlib.import_module(module)
        obj: Any = mod
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        looked = [p for p in sys.path if p.endswith("/sources")]
        looked += [p for p in sys.path if not p.endswith("/sources")][:4]
        locked = ((desc or {}).get("reference_imports") or {}).get(missing.partition(".")[0])
        if missing.partition(".")[0] == module.partition(".")[0]:
            why = f"module {missing} is neither shipped in the release nor on this host"
            hint = ("build with the project root set (tileship.toml next to the operator modules) so the release "
                    "ships them")
        else:
            why = f"third-party module {missing!r} is not installed on this host"
            hint = f"pip install {locked}" if locked else f"install the package providing {missing}"
        raise ArtifactLoadError(f"cannot import the {what} {path}: {why} (looked in {', '.join(looked)})", spec_id=name,
                                hint=hint) from exc
    except CompileForbidden as exc:  # the module compiles on import: no shape added to the release would help
        raise ArtifactLoadError(f"cannot import the {what} {path}: {compiled_on_import(exc, module)}", spec_id=name,
                                hint=ON_IMPORT_HINT) from exc
    except Exception as exc:  # anything the user's module raises at import: a load failure naming it
        raise ArtifactLoadError(f"cannot import the {what} {path}: {type(exc).__name__}: {exc}", spec_id=name,
                                hint=f"the operator module must be importable (sys.path: {sys.path[:3]}...)") from exc


ON_IMPORT_HINT = ("compile only in the kernel factory (tileship builds it ahead of time); move the module-level "
                  "tilelang.compile (or the call of a @tilelang.jit kernel) into a function")


def compiled_on_import(exc: CompileForbidden, module: str) -> str:
    """What the no-JIT guard caught while ``module`` was being imported: the module whose code made the compile
    call (the last frame outside TileLang, tileship and the import machinery), and the entry point."""
    culprit = module
    tb = exc.__traceback__
    while tb is not None:
        name = str(tb.tb_frame.f_globals.get("__name__", ""))
        if name and not name.startswith(("tilelang", "tvm", "tileship", "importlib", "_frozen_importlib")):
            culprit = name
        tb = tb.tb_next
    where = f" ({exc.where})" if exc.where else ""
    return (f"{culprit} compiled a TileLang kernel at import time{where}; operator modules must not compile "
            "on import")
