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
