"""The Python an operator needs at serve time travels with the release.

For each operator: the declaring module, the modules of its factory, reference and sample hook,
and every module they import (transitively) that lies under the project root are copied into
the bundle as ``sources/<module path>.py`` (hashed by the manifest like every identity file).
Everything else they import is classified: the standard library is ignored, any other top-level
module is a third-party import, recorded in the lock with its distribution's version
(``reference_imports``), so a serving host missing one is named before it fails a request.

The loader puts ``<release>/sources`` first on ``sys.path`` (``runtime.references.use_sources``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from tileship.declare.factory import module_relative, resolve
from tileship.declare.spec import Operator

SOURCES = "sources"


def _module_file(name: str) -> Path | None:
    mod = sys.modules.get(name)
    file = getattr(mod, "__file__", None)
    if file is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        file = spec.origin if spec is not None and spec.has_location else None
    return Path(file).resolve() if file else None


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of the modules ``path`` (module ``module``) imports, anywhere in the file."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            if prefix:
                out.add(prefix)
                out.update(f"{prefix}.{a.name}" for a in node.names if a.name != "*")
    return out


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def collect(op: Operator, root: Path | None) -> tuple[dict[str, Path], dict[str, str | None]]:
    """(bundle path -> file for the local modules ``op`` needs, third-party top-level import ->
    version of its distribution (None when no installed distribution provides it)).
    Local means under ``root``; with no root nothing is shipped (an installed package)."""
    root = root.resolve() if root is not None else None
    start = {op.module or "", getattr(op.reference, "__module__", ""),
             resolve(op.factory, operator=op.name).qualname.rpartition(".")[0]}
    if op.sample is not None:
        start.add(getattr(op.sample, "__module__", ""))
    todo = sorted(m for m in start if m)
    seen: set[str] = set()
    local: dict[str, Path] = {}
    third: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in ("__main__", "__future__"):
            continue
        file = _module_file(name)
        if file is None:
            if "." in name:  # "from pkg import function": pkg is what is imported
                continue
            third.add(top)
            continue
        if root is None or not _under(file, root):
            if top != "tileship":
                third.add(top)
            continue
        local[module_relative(str(file), name)] = file
        parts = name.split(".")
        for i in range(1, len(parts)):  # the packages above it ship their __init__.py
            todo.append(".".join(parts[:i]))
        todo.extend(_imports(file, name))
    return dict(sorted(local.items())), {t: _version(t) for t in sorted(third)}


def _version(top: str) -> str | None:
    dists = importlib.metadata.packages_distributions().get(top) or []
    for d in dists:
        try:
            return f"{d}=={importlib.metadata.version(d)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def ship(
    ops: Mapping[str, Operator], root: Path | None, dest: Path
) -> tuple[dict[str, list[str]], dict[str, dict[str, str | None]]]:
    """Copy every operator's local sources into ``dest/sources``; return (operator -> its bundle
    paths, operator -> its third-party imports with versions)."""
    paths: dict[str, list[str]] = {}
    imports: dict[str, dict[str, str | None]] = {}
    for name, op in ops.items():
        local, third = collect(op, root)
        for rel, file in local.items():
            target = dest / SOURCES / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(file.read_bytes())
        paths[name] = list(local)
        imports[name] = third
    return paths, imports
