"""``atomic_file.write_file``, how tileship replaces a file a user owns (a project file, a lock, a report, an
evidence copy): whole at any kill, through a symlink, with the file's mode kept; what is not a regular file is
refused. ``tileship verify --json-out`` writes through it (before: the rename put a regular 0644 file in place of
a symlink, and a 0600 file became readable by others)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import crashpoints
import pytest

from tileship.release.atomic_file import target_of, write_file

_WRITE = """
import sys
from tileship.release.atomic_file import write_file
arm()
write_file(sys.argv[1], "new " * 5000)
"""


def test_killed_at_every_boundary_the_file_is_old_or_new_and_the_next_write_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    seen: set[str] = set()
    leaving: list[int] = []  # the boundaries whose kill leaves a temporary

    def fresh() -> None:
        path.write_text("old")
        path.chmod(0o600)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-2000:]
        body = path.read_text()
        assert body in ("old", "new " * 5000), f"boundary {o.n}: part of a file ({len(body)} characters)"
        assert path.stat().st_mode & 0o777 == 0o600
        seen.add(body[:3])
        if len(list(tmp_path.iterdir())) > 1:
            leaving.append(o.n)

    outcomes = list(crashpoints.sweep([str(path)], before=fresh, check=check, code=_WRITE))
    assert sum(o.killed for o in outcomes) >= 2 and seen == {"old", "new"}, seen
    fresh()
    assert leaving and crashpoints.run([str(path)], leaving[-1], code=_WRITE).killed
    write_file(path, "again")
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"] and path.read_text() == "again"


def test_a_symlink_is_written_through_and_the_mode_kept(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "tileship.toml"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o751)
    link, chain = tmp_path / "link.toml", tmp_path / "chain.toml"
    link.symlink_to(real)
    chain.symlink_to(link)  # a link to a link: the final target is written
    assert target_of(chain) == real.resolve()
    assert write_file(chain, b"new") == real.resolve()
    assert chain.is_symlink() and link.is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o751
    new = tmp_path / "new.txt"
    write_file(new, "x")  # a new file: what open() would give it
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    for p in (fifo, tmp_path / "dir"):
        with pytest.raises(OSError, match="not a regular file"):
            write_file(p, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo"]


def test_verify_json_out_writes_through_a_symlink_and_keeps_the_mode(cpu_release: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tileship.cli import app

    real = tmp_path / "keep" / "evidence.json"
    real.parent.mkdir()
    real.write_text("{}")
    real.chmod(0o600)
    link = tmp_path / "evidence.json"
    link.symlink_to(real)
    res = CliRunner().invoke(app, ["verify", str(cpu_release), "--seeds", "0", "--no-timing", "--grid", "0",
                                   "--limit", "64", "--only", "add", "--json-out", str(link)])
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and json.loads(real.read_text())["specializations"]
    assert real.stat().st_mode & 0o777 == 0o600


def test_threads_writing_one_file_at_once_each_replace_it_whole(tmp_path: Path) -> None:
    """Writers in threads of one process shared the temporary ``<name>.tmp<pid>``: each removed the others' before
    creating its own, so all but one failed with FileNotFoundError at the rename (concurrent ``pack`` to one path)."""
    import threading

    path = tmp_path / "shared.toml"
    bodies = [f"writer {i}\n" * 2000 for i in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(bodies))

    def write(body: str) -> None:
        start.wait()
        try:
            for _ in range(20):
                write_file(path, body)
        except BaseException as exc:  # noqa: BLE001 -- collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert path.read_text() in bodies
    assert [p.name for p in tmp_path.iterdir()] == ["shared.toml"], "a temporary was left behind"
