"""`tileship pack` killed at write boundaries while it replaces an existing archive of another
release: the archive at the path is the old one or the new one, whole (``bundle.unpack`` checks it),
and the next pack leaves no temporary beside it. (``pack`` writes a temporary, fsyncs, renames.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import crashpoints

from tileship.release import bundle, integrity


def test_pack_killed_at_write_boundaries(cpu_release: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(cpu_release, other)
    data = json.loads((other / "release.json").read_text())
    data["kernel_revision"] = "other"
    (other / "release.json").write_text(json.dumps(data))
    new = bundle.write_manifest(other)["release_id"]
    old = integrity.check(cpu_release, trusted_keys=[]).release_id
    archive, saved = tmp_path / "r.tileship.tar.gz", tmp_path / "saved.tar.gz"
    bundle.pack(cpu_release, saved)
    args = ["pack", str(other), "-o", str(archive)]
    shutil.copyfile(saved, archive)
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    seen: set[str] = set()
    n_unpacked = [0]

    def fresh() -> None:
        shutil.copyfile(saved, archive)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        n_unpacked[0] += 1
        got = bundle.unpack(archive, tmp_path / f"u{n_unpacked[0]}")  # raises on a torn archive
        assert got.name in (old, new), got.name
        seen.add("old" if got.name == old else "new")
        nxt = crashpoints.run(args, 10**6)  # the next pack
        assert nxt.returncode == 0, nxt.output
        assert bundle.unpack(archive, tmp_path / f"v{n_unpacked[0]}").name == new
        assert sorted(p.name for p in tmp_path.glob("r.tileship.tar.gz*")) == [archive.name], "a temporary was left"

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
