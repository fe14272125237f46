"""``tileship propose --apply``: write proposals into the project file's ``[shapes.<operator>]`` tables.

The file is edited as text: every ``[shapes.*]`` table (``[tool.tileship.shapes.*]`` in
pyproject.toml) is removed and all of them are written again at the end, the existing entries
first, then the proposals (comments inside those tables are lost; the rest of the file is kept
byte for byte). The result is parsed back and checked (``apply_shapes``) before it replaces the
file, atomically, keeping its mode and writing through a symlink (``apply_to_project``); anything
else, e.g. shapes written as an inline table, is refused with a DeclarationError and the file left
as it was.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from tileship.declare.project import Project, parse_project
from tileship.declare.project_shapes import apply_shapes
from tileship.declare.propose import Proposal, to_toml
from tileship.declare.spec import Operator
from tileship.errors import DeclarationError


def project_file(project: Project) -> tuple[Path, str]:
    """(path, table prefix) of the file ``project`` was read from. Raises DeclarationError for
    the built-in project, which has no file."""
    if project.root is None:
        raise DeclarationError("the built-in catalog project has no file to apply proposals to",
                               hint="pass --project tileship.toml, or write the printed TOML into one")
    if (project.root / "tileship.toml").is_file():
        return project.root / "tileship.toml", ""
    return project.root / "pyproject.toml", "tool.tileship."


def strip_tables(text: str, prefix: str) -> str:
    """``text`` without its ``[<prefix>shapes.<op>]`` tables (header to the next table header)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        head = line.strip()
        if head.startswith("[") and not head.startswith("[["):
            skipping = head.startswith(f"[{prefix}shapes.")
        elif head.startswith("[["):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out).rstrip("\n") + "\n"


def apply_to_project(project: Project, proposals: Iterable[Proposal], ops: Mapping[str, Operator]) -> Path:
    """Write ``proposals`` into ``project``'s file; returns its path. Raises DeclarationError
    (the file unchanged) when the result does not parse back to the expected shapes.

    The file is replaced whole (``atomic_file.write_file``): killed at any instant it is the old
    file or the new one. It keeps its permission bits (and owner where allowed); a symlinked
    ``tileship.toml`` stays a link and its target is rewritten, as an editor saves it (replacing
    the link would silently fork a project file kept elsewhere)."""
    path, prefix = project_file(project)
    proposals = list(proposals)
    text = strip_tables(path.read_text(), prefix)
    new = text + "\n" + to_toml(proposals, ops, prefix=prefix, keep=project.shapes)
    try:
        data = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise DeclarationError(f"{path}: the edited file would not parse ({exc})",
                               hint="add the printed [shapes.<operator>] tables by hand") from None
    if prefix:
        data = data.get("tool", {}).get("tileship", {})
    parsed = parse_project(data, root=path.parent, source=path.name)
    want = {p.operator for p in proposals} | set(project.shapes)
    if set(parsed.shapes) != want:
        raise DeclarationError(f"{path}: the edited file declares shapes for {sorted(parsed.shapes)}, "
                               f"expected {sorted(want)}",
                               hint="add the printed [shapes.<operator>] tables by hand")
    apply_shapes(dict(ops), parsed.shapes)
    from tileship.release.atomic_file import write_file

    write_file(path, new)  # whole and fsynced; through a symlink, keeping the mode
    return path


__all__ = ["apply_to_project", "project_file", "strip_tables"]
