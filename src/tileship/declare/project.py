"""The project file: which operator modules, which targets, which model they serve.

Read from ``tileship.toml`` (top level) or ``[tool.tileship]`` in ``pyproject.toml``.
With neither, the built-in catalog project is used (``builtin_project``).

    model = "demo-llm"
    model_version = "1"
    operators = ["tileship.catalog.gemm", "mypkg.kernels.norm"]
    targets = ["cuda-sm90a", "c"]
    routing = "pinned"        # or "evidence"     (how verified evidence picks a path)
    drift = "fallback"        # or "strict"       (blocking drift: serve the reference, or refuse)
    allow_unverified = false  # run kernels on a GPU without verification evidence

    [shapes.gemm]             # shapes added to an operator's declaration (declare.project_shapes;
    static = [{M = 1, N = 4096, K = 4096}]   # ``tileship propose`` writes these from telemetry)
    ranges = [{dim = "M", min = 1, max = 64, fixed = {N = 4096, K = 4096}}]
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship.declare.factory import resolve
from tileship.declare.outputs import infer_outputs
from tileship.declare.project_shapes import ShapeAdditions, apply_shapes, parse_shape_tables
from tileship.declare.spec import Operator, Specialization, Target, expand
from tileship.errors import CompileForbidden, DeclarationError

ROUTINGS = ("pinned", "evidence")
DRIFT_POLICIES = ("fallback", "strict")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_KEYS = {"model", "model_version", "operators", "targets", "routing", "drift", "allow_unverified", "shapes"}


@dataclass(frozen=True)
class Project:
    model: str
    model_version: str
    operator_modules: tuple[str, ...]
    targets: tuple[str, ...]
    routing: str = "pinned"
    drift: str = "fallback"
    allow_unverified: bool = False
    root: Path | None = None
    #: ``[shapes.<operator>]``: shapes and ranges appended to those declarations by ``load_operators``
    shapes: Mapping[str, ShapeAdditions] = field(default_factory=dict)

    def policy(self) -> dict[str, Any]:
        return {"routing": self.routing, "drift": self.drift, "allow_unverified": self.allow_unverified}


def builtin_project() -> Project:
    """The demo's embedded default: the built-in catalog for sm_90a and the CPU target."""
    return Project(
        model="tileship-demo",
        model_version="1",
        operator_modules=("tileship.catalog.gemm", "tileship.catalog.rmsnorm", "tileship.catalog.attention",
                          "tileship.catalog.cpu"),
        targets=("cuda-sm90a", "c"),
    )


def parse_project(data: Mapping[str, Any], *, root: Path | None = None, source: str = "project") -> Project:
    """Validate a project table; raise DeclarationError naming the bad key."""
    unknown = set(data) - _KEYS
    if unknown:
        raise DeclarationError(f"unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})", field=source)

    def need(key: str, kind: type) -> Any:
        if key not in data:
            raise DeclarationError("is required", field=f"{source}.{key}")
        if not isinstance(data[key], kind):
            raise DeclarationError(f"must be {kind.__name__}", field=f"{source}.{key}")
        return data[key]

    model = need("model", str)
    mods = need("operators", list)
    if not mods or not all(isinstance(m, str) for m in mods):
        raise DeclarationError("must be a non-empty list of module names", field=f"{source}.operators")
    for m in mods:
        if not _MODULE.fullmatch(m):
            dotted = m.strip().removeprefix("./").removesuffix(".py").replace("/", ".").replace("\\", ".")
            example = dotted if _MODULE.fullmatch(dotted) else "mypkg.kernels"
            raise DeclarationError(f"{m!r} is not a module name", field=f"{source}.operators",
                                   hint=f'name the module as Python imports it, e.g. "{example}" (from the project '
                                   "file's directory or a directory on PYTHONPATH), not its file")
    targets = data.get("targets", ["cuda-sm90a", "c"])
    if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise DeclarationError(f"must be a list of target names (e.g. [\"cuda-sm90a\", \"c\"]), got {targets!r}",
                               field=f"{source}.targets")
    for t in targets:
        try:
            Target(t)
        except DeclarationError as exc:
            raise DeclarationError(exc.message, field=f"{source}.targets", hint=exc.hint) from None
    routing = data.get("routing", "pinned")
    if routing not in ROUTINGS:
        raise DeclarationError(f"must be one of {ROUTINGS}, got {routing!r}", field=f"{source}.routing")
    drift = data.get("drift", "fallback")
    if drift not in DRIFT_POLICIES:
        raise DeclarationError(f"must be one of {DRIFT_POLICIES}, got {drift!r}", field=f"{source}.drift")
    return Project(model=model, model_version=str(data.get("model_version", "1")), operator_modules=tuple(mods),
                   targets=tuple(targets), routing=routing, drift=drift,
                   allow_unverified=bool(data.get("allow_unverified", False)), root=root,
                   shapes=parse_shape_tables(data.get("shapes", {}), source))


def find_project(start: Path | None = None) -> Project:
    """The project of ``start`` (default: cwd): tileship.toml, else [tool.tileship], else builtin.

    Raises DeclarationError when ``start`` is given and does not exist: a mistyped ``--project`` must not
    quietly fall back to the built-in catalog."""
    if start is not None and not start.exists():
        raise DeclarationError(f"{start}: no such project file or directory", field="project",
                               hint="name a tileship.toml, a pyproject.toml with [tool.tileship], or their folder")
    here = (start or Path.cwd()).resolve()
    if here.is_file():
        return _read(here)
    if start is not None and not here.is_dir():
        _regular(start, True)  # named as given (resolved, a link to /dev/zero would read "/dev/zero")
    for d in (here, *here.parents):
        if _regular(d / "tileship.toml"):
            return _read(d / "tileship.toml")
        py = d / "pyproject.toml"
        if _regular(py):
            tool = _toml(py).get("tool", {})
            if isinstance(tool, dict) and "tileship" in tool:
                return parse_project(tool["tileship"], root=d, source="[tool.tileship]")
    return builtin_project()


def _regular(path: Path, present: bool | None = None) -> bool:
    """Whether ``path`` is a regular file; raises DeclarationError naming it when it is there as something a
    project file cannot be (a FIFO would block the read for good, a link to /dev/zero read without end)."""
    if path.is_file():
        return True
    if present if present is not None else (path.exists() and not path.is_dir()):
        raise DeclarationError(f"{path}: not a regular file (a FIFO, a device or a socket?)", field="project",
                               hint="a project file is a tileship.toml or a pyproject.toml")
    return False


def _toml(path: Path) -> dict[str, Any]:
    """``path`` parsed as TOML. Raises DeclarationError naming the file for anything else: invalid
    TOML or UTF-8, an integer past Python's digit limit, arrays or tables nested too deeply."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, the integer digit limit
        raise DeclarationError(f"{path}: not valid TOML: {str(exc)[:300]}") from None
    except RecursionError:
        raise DeclarationError(f"{path}: not valid TOML: nested too deeply") from None


def _read(path: Path) -> Project:
    data = _toml(path)
    if path.name == "pyproject.toml":
        tool = data.get("tool", {})
        data = tool.get("tileship", {}) if isinstance(tool, dict) else {}
    return parse_project(data, root=path.parent, source=path.name)


def load_operators(project: Project) -> dict[str, Operator]:
    """Import the project's operator modules; collect every module-level ``Operator``.

    Raises DeclarationError on an import failure, a duplicate name, or a bad declaration
    (the project's ``[shapes.<operator>]`` included: they are appended here).
    """
    if project.root is not None and str(project.root) not in sys.path:
        sys.path.insert(0, str(project.root))
    ops: dict[str, Operator] = {}
    for mod_name in project.operator_modules:
        try:
            mod = importlib.import_module(mod_name)
        except CompileForbidden as exc:  # this process serves a release, and the module compiles on import
            from tileship.runtime.references import ON_IMPORT_HINT, compiled_on_import

            raise DeclarationError(f"cannot import {mod_name}: {compiled_on_import(exc, mod_name)}",
                                   field="operators", hint=ON_IMPORT_HINT) from exc
        except Exception as exc:  # an import error in user code is a declaration problem
            raise DeclarationError(f"cannot import {mod_name}: {type(exc).__name__}: {exc}", field="operators") from exc
        found = [v for v in vars(mod).values() if isinstance(v, Operator)]
        if not found:
            raise DeclarationError(f"module {mod_name} declares no Operator", field="operators")
        for op in found:
            if op.module != mod_name:  # re-exported: build workers look it up where it was found
                op = dataclasses.replace(op, module=mod_name)
            op.check()
            if op.infers_outputs:
                op = infer_outputs(op)
            if op.name in ops and ops[op.name] != op:
                raise DeclarationError(f"operator name declared twice (second in {mod_name})",
                                       operator=op.name, field="name")
            ops[op.name] = op
    return dict(sorted(apply_shapes(ops, project.shapes).items()))


def operator_module(op: Operator) -> str:
    """The module declaring ``op`` (where build workers look it up), never the factory's."""
    return op.module or op.factory.__module__


def specializations(project: Project, ops: Mapping[str, Operator]) -> list[Specialization]:
    return [s for op in ops.values() for s in expand(op, project.targets)]


def revision_root(project: Project, ops: Mapping[str, Operator]) -> Path | None:
    """Where the kernel revision is read: the project's root, else the directory holding the
    first operator's source (so the built-in catalog pins the commit of this repository)."""
    if project.root is not None:
        return project.root
    for op in ops.values():
        for src in resolve(op.factory, operator=op.name).source_files:
            return Path(src).parent
    return None


def source_digest(ops: Mapping[str, Operator]) -> dict[str, str]:
    """sha256 of each operator's source file(s) (factory and reference modules)."""
    out: dict[str, str] = {}
    for name, op in ops.items():
        h = hashlib.sha256()
        files = sorted({*resolve(op.factory, operator=name).source_files, _source_file(op.reference) or ""} - {""})
        for fn in files:
            h.update(Path(fn).read_bytes())
        out[name] = "sha256:" + h.hexdigest()
    return out


def _source_file(fn: object) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(fn))  # type: ignore[arg-type]
    except (TypeError, OSError):
        return None
