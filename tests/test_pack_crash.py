"""`tileship pack` killed at write boundaries while it replaces an existing archive of another
release: the archive at the path is the old one or the new one, whole (``bundle.unpack`` checks it),
and the next pack leaves no temporary beside it. (``pack`` writes a temporary, fsyncs, renames.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import crashpoints
import pytest

from tileship.release import bundle, integrity


@pytest.mark.parametrize("via", ["path", "symlink"])
def test_pack_killed_at_write_boundaries(cpu_release: Path, tmp_path: Path, via: str) -> None:
    other = tmp_path / "other"
    shutil.copytree(cpu_release, other)
    data = json.loads((other / "release.json").read_text())
    data["kernel_revision"] = "other"
    (other / "release.json").write_text(json.dumps(data))
    new = bundle.write_manifest(other)["release_id"]
    old = integrity.check(cpu_release, trusted_keys=[]).release_id
    archive, saved = tmp_path / "r.tileship.tar.gz", tmp_path / "saved.tar.gz"
    real = archive
    if via == "symlink":  # the archive is kept elsewhere; the link must stay a link at every kill
        real = tmp_path / "shared" / "kept.tar.gz"
        real.parent.mkdir()
        archive.symlink_to(real)
    bundle.pack(cpu_release, saved)
    args = ["pack", str(other), "-o", str(archive)]
    shutil.copyfile(saved, real)
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    seen: set[str] = set()
    n_unpacked = [0]

    def fresh() -> None:
        shutil.copyfile(saved, real)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        assert archive.is_symlink() == (via == "symlink")
        n_unpacked[0] += 1
        got = bundle.unpack(archive, tmp_path / f"u{n_unpacked[0]}")  # raises on a torn archive
        assert got.name in (old, new), got.name
        seen.add("old" if got.name == old else "new")
        nxt = crashpoints.run(args, 10**6)  # the next pack
        assert nxt.returncode == 0, nxt.output
        assert bundle.unpack(archive, tmp_path / f"v{n_unpacked[0]}").name == new
        assert sorted(p.name for p in real.parent.glob(real.name + "*")) == [real.name], "a temporary was left"

    outcomes = list(crashpoints.sweep(args, before=fresh, check=check, step=max(1, total // 8)))
    assert sum(o.killed for o in outcomes) >= 4 and seen == {"old", "new"}, seen


def test_a_killed_pack_leaves_its_scratch_copy_beside_the_archive_for_the_next_pack(
        cpu_release: Path, tmp_path: Path, monkeypatch) -> None:
    """The private copy a pack hashes and packs lived in a ``tempfile`` directory: a killed pack left
    a copy of the release in /tmp for good. It is now beside the archive, named for the pack's pid,
    and the next pack to that path removes it."""
    private_tmp = tmp_path / "tmpdir"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    out = tmp_path / "out"
    out.mkdir()
    archive = out / "r.tileship.tar.gz"
    args = ["pack", str(cpu_release), "-o", str(archive)]
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    archive.unlink()
    killed = crashpoints.run(args, total // 2)  # in the middle of the copy
    assert killed.killed, killed.output
    assert not list(private_tmp.rglob("manifest.json")), "a killed pack left a copy of the release in the temp dir"
    left = [p for p in out.iterdir() if p.is_dir()]
    assert left and all(p.name.startswith(archive.name + ".tmp") for p in left), sorted(out.iterdir())
    bundle.pack(cpu_release, archive)  # the next pack
    assert sorted(p.name for p in out.iterdir()) == [archive.name], "the next pack left a killed one's scratch"
    assert bundle.unpack(archive, tmp_path / "u").name == integrity.check(cpu_release, trusted_keys=[]).release_id


def test_the_next_pack_removes_dead_packs_scratch_directories_and_keeps_live_ones(cpu_release: Path,
                                                                                  tmp_path: Path) -> None:
    import os

    archive = tmp_path / "r.tileship.tar.gz"
    dead = 2**22 + 4321  # no such pid
    stale = tmp_path / f"{archive.name}.tmp{dead}-copy-abc123"
    (stale / "copy" / "specs").mkdir(parents=True)
    (stale / "copy" / "manifest.json").write_text("{}")
    (tmp_path / f"{archive.name}.tmp{dead}-xyz").write_bytes(b"half an archive")
    live = tmp_path / f"{archive.name}.tmp{os.getppid()}-copy-def456"  # a pack still running
    live.mkdir()
    bundle.pack(cpu_release, archive)
    assert sorted(p.name for p in tmp_path.glob(archive.name + "*")) == [archive.name, live.name]
    assert bundle.unpack(archive, tmp_path / "u").name == integrity.check(cpu_release, trusted_keys=[]).release_id


def test_pack_writes_through_a_symlinked_archive_keeping_its_mode(cpu_release: Path, tmp_path: Path) -> None:
    """``tileship pack -o LINK`` replaced the symlink by a regular 0644 file (a temporary renamed over the link):
    the archive kept elsewhere (a shared folder the link points into) stayed the old one. The link's final target
    is now replaced, the link stays a link, the target keeps its permission bits, and the temporaries go beside
    the target (where the rename can be atomic)."""
    from typer.testing import CliRunner

    from tileship.cli import app

    real = tmp_path / "shared" / "r.tileship.tar.gz"
    real.parent.mkdir()
    real.write_bytes(b"an older archive")
    real.chmod(0o640)
    link, chain = tmp_path / "link.tar.gz", tmp_path / "out" / "r.tileship.tar.gz"
    chain.parent.mkdir()
    link.symlink_to(real)
    chain.symlink_to(link)  # a link to a link: the final target is written
    res = CliRunner().invoke(app, ["pack", str(cpu_release), "-o", str(chain)])
    assert res.exit_code == 0, res.output
    assert chain.is_symlink() and link.is_symlink(), "the symlink was replaced by a regular file"
    assert bundle.unpack(real, tmp_path / "u").name == integrity.check(cpu_release, trusted_keys=[]).release_id
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == [real.name]
    assert sorted(p.name for p in chain.parent.iterdir()) == [chain.name]


def test_pack_to_a_dangling_symlink_creates_its_target(cpu_release: Path, tmp_path: Path) -> None:
    real = tmp_path / "shared" / "r.tileship.tar.gz"
    real.parent.mkdir()
    link = tmp_path / "r.tileship.tar.gz"
    link.symlink_to(real)
    bundle.pack(cpu_release, link)
    assert link.is_symlink() and real.is_file()
    assert bundle.unpack(real, tmp_path / "u").name == integrity.check(cpu_release, trusted_keys=[]).release_id


def test_pack_refuses_what_is_not_a_regular_file(cpu_release: Path, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "r.tileship.tar.gz"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        bundle.pack(cpu_release, fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fifo.name, cpu_release.name])
