"""`tileship propose --apply --out P` killed at every write boundary: the project file reads as the old one or
the new one (never half), so does ``--out`` (before: ``--out`` was written in place, so a kill left half a
TOML there, or an empty file), and the next run finishes with no temporary left beside either file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import crashpoints

PROJECT = 'model = "m"\noperators = ["tileship.catalog.cpu"]\ntargets = ["c"]\n# kept\n'
#: the CLI, with the operators imported before the boundaries count (TileLang's imports write caches)
CODE = """
import tileship.catalog.cpu
from tileship.cli import main
arm()
main()
"""
OLD_OUT = "# the previous proposals\n[shapes.add]\nstatic = [\n  {N = 3},\n]\n"


def _tele() -> dict:
    row = {"dtype": "float32", "dtypes": ["float32", "float32"], "dims": {"N": 1 << 25}, "shapes": [[1 << 25]] * 2,
           "reason": "undeclared_shape", "calls": 5, "seconds": 0.1}
    return {"schema": 1, "ops": {"add": {"rows": [row], "kernel_calls": 0,
                                         "other": {"calls": 0, "seconds": 0.0, "reasons": {}}}}}


def test_propose_apply_and_out_killed_at_every_write_boundary(tmp_path: Path) -> None:
    project, out, tele = tmp_path / "tileship.toml", tmp_path / "p.toml", tmp_path / "t.json"
    tele.write_text(json.dumps(_tele()))
    args = ["propose", str(tele), "--project", str(project), "--apply", "--out", str(out)]
    want = {"N": 1 << 25}
    seen: set[tuple[str, str]] = set()

    def fresh() -> None:
        project.write_text(PROJECT)
        out.write_text(OLD_OUT)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-2000:]
        text = project.read_text()
        assert text == PROJECT or tomllib.loads(text)["shapes"]["add"]["static"] == [want], \
            f"boundary {o.n}: the project file is neither the old one nor the new one:\n{text}"
        body = out.read_text()
        assert body == OLD_OUT or tomllib.loads(body)["shapes"]["add"]["static"] == [want], \
            f"boundary {o.n}: --out is neither the old file nor the new one: {body!r}"
        seen.add(("old" if text == PROJECT else "new", "old" if body == OLD_OUT else "new"))

    outcomes = list(crashpoints.sweep(args, before=fresh, check=check, cwd=tmp_path, code=CODE))
    assert sum(o.killed for o in outcomes) >= 2 and seen >= {("old", "old"), ("new", "new")}, seen
    fresh()
    crashpoints.run(args, 3, cwd=tmp_path, code=CODE)  # a killed run's temporaries, then the next run
    after = crashpoints.run(args, 10**6, cwd=tmp_path, code=CODE)
    assert after.returncode == 0, after.output[-2000:]
    assert tomllib.loads(out.read_text())["shapes"]["add"]["static"] == [want]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml", "t.json", "tileship.toml"], \
        "the temporaries of killed runs were left"


def test_propose_apply_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    """A symlinked project file (kept in a dotfiles or shared folder) stays a link and its target gets the new
    shapes; the target's and ``--out``'s permission bits are kept. Before: both became regular 0644 files
    (the atomic rename replaced the link itself, with the temporary's mode)."""
    real, out, tele = tmp_path / "shared" / "tileship.toml", tmp_path / "p.toml", tmp_path / "t.json"
    real.parent.mkdir()
    real.write_text(PROJECT)
    real.chmod(0o640)
    link = tmp_path / "work" / "tileship.toml"
    link.parent.mkdir()
    link.symlink_to(real)
    out.write_text(OLD_OUT)
    out.chmod(0o600)
    tele.write_text(json.dumps(_tele()))
    args = ["propose", str(tele), "--project", str(link), "--apply", "--out", str(out)]
    done = crashpoints.run(args, 10**6, cwd=link.parent, code=CODE)
    assert done.returncode == 0, done.output[-2000:]
    assert link.is_symlink() and link.resolve() == real.resolve(), "the project file's symlink was replaced"
    assert tomllib.loads(real.read_text())["shapes"]["add"]["static"] == [{"N": 1 << 25}]
    assert real.read_text().startswith(PROJECT)
    assert (real.stat().st_mode & 0o777, out.stat().st_mode & 0o777) == (0o640, 0o600)
    assert sorted(p.name for p in real.parent.iterdir()) == ["tileship.toml"]
