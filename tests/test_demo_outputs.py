"""`tileship demo -o DIR` writes ``DIR/tileship.toml`` and ``DIR/tileship.lock`` as files of the user's
(``atomic_file.write_file``), as every other command that writes a file a user names: killed at any instant the
file is the old one or the new one, never part of one; a symlinked one stays a link, its target keeps its mode.
It used ``Path.write_text`` (truncate, then write in place): a kill in the write left half a project file."""

from __future__ import annotations

from pathlib import Path

import crashpoints

OLD = 'model = "mine"\n'


def test_demo_killed_while_writing_its_project_file_leaves_the_old_one_or_the_new_one(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    real = tmp_path / "kept" / "tileship.toml"
    real.parent.mkdir()
    (out / "tileship.toml").symlink_to(real)
    seen: set[str] = set()

    for n in range(1, 16):  # the project file is written within the first boundaries, long before the build
        real.write_text(OLD)
        real.chmod(0o640)
        o = crashpoints.run(["demo", "-o", str(out), "--cpu-only", "-j", "1"], n)
        assert o.killed, o.output[-800:]
        body = real.read_text()
        assert body == OLD or (body.startswith("model = ") and body.rstrip().endswith("]") and "targets" in body), \
            f"boundary {n}: part of a project file: {body!r}"
        assert (out / "tileship.toml").is_symlink() and real.stat().st_mode & 0o777 == 0o640
        seen.add("old" if body == OLD else "new")
        if body != OLD:
            break
    assert seen == {"old", "new"}, seen
