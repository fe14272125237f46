"""`tileship lock` killed at every write boundary while it replaces an existing lock: the lock reads
as the old one or the new one (``read_lock``), never half of one, and the next `tileship lock`
writes it whole. (``write_lock`` was already a temporary + ``os.replace``; now also fsynced.)"""

from __future__ import annotations

from pathlib import Path

import crashpoints

from tileship.build.lock import read_lock

DIGEST = "sha256:" + "1" * 64


def test_lock_killed_at_every_write_boundary(tmp_path: Path) -> None:
    project = tmp_path / "tileship.toml"
    project.write_text('model = "m"\noperators = ["tileship.catalog.cpu"]\ntargets = ["c"]\n')
    lock = tmp_path / "tileship.lock"
    first = crashpoints.run(["lock", "--project", str(project), "-o", str(lock)], 10**6, cwd=tmp_path)
    total = crashpoints.boundaries(first)
    old = lock.read_bytes()
    seen: set[str] = set()

    def restore() -> None:
        lock.write_bytes(old)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        data = read_lock(lock)  # raises LockError on a half-written lock
        assert lock.read_bytes() == old or data["image_digest"] == DIGEST, f"boundary {o.n}: neither lock"
        seen.add("old" if lock.read_bytes() == old else "new")

    args = ["lock", "--project", str(project), "-o", str(lock), "--image-digest", DIGEST]
    outcomes = list(crashpoints.sweep(args, before=restore, check=check, cwd=tmp_path,
                                      step=max(1, total // 4)))
    assert sum(o.killed for o in outcomes) >= 2 and seen == {"old", "new"}, seen
    after = crashpoints.run(args, 10**6, cwd=tmp_path)  # the next run: whole, and no temporary left beside it
    assert after.returncode == 0 and read_lock(lock)["image_digest"] == DIGEST
    assert not list(tmp_path.glob("tileship.lock.tmp*")), "the temporaries of killed runs were left"


def test_lock_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    """A lock kept elsewhere and linked into the project stays a link, its target rewritten with its mode kept.
    Before: the rename put a regular 0644 file in the link's place."""
    project = tmp_path / "tileship.toml"
    project.write_text('model = "m"\noperators = ["tileship.catalog.cpu"]\ntargets = ["c"]\n')
    real = tmp_path / "shared" / "tileship.lock"
    real.parent.mkdir()
    real.write_text("old: lock\n")
    real.chmod(0o640)
    link = tmp_path / "tileship.lock"
    link.symlink_to(real)
    done = crashpoints.run(["lock", "--project", str(project), "-o", str(link), "--image-digest", DIGEST], 10**6,
                           cwd=tmp_path)
    assert done.returncode == 0, done.output[-2000:]
    assert link.is_symlink() and read_lock(real)["image_digest"] == DIGEST and real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["tileship.lock"]
