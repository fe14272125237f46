"""A release that passes its hashes but cannot be loaded is refused naming the release's own file, and the failed
load leaves no copy of it behind.

Before: a release without ``release.json`` (an unsigned, hand-made or trimmed bundle whose manifest was rewritten)
raised a bare FileNotFoundError; errors read from the private snapshot named ``/tmp/tileship-snapshot-*/...``,
a path that is gone once the process exits; and every failed load kept its full snapshot until the process exited
(a server retrying a bad release on each reload grew /tmp by one release per attempt).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tileship.errors import BundleIntegrityError, LockError, TileshipError
from tileship.release import bundle
from tileship.runtime.loader import load


@pytest.fixture
def snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where this test's snapshots go (the temp directory), to count them."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def _remove(rel: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).unlink()


def _garbage_lock(root: Path) -> None:
    (root / "tileship.lock").write_text("a: [b\n")


CASES: dict[str, tuple[Callable[[Path], None], str, type[TileshipError]]] = {
    "no-release.json": (_remove("release.json"), "release.json", BundleIntegrityError),
    "no-lock": (_remove("tileship.lock"), "tileship.lock", BundleIntegrityError),
    "garbage-lock": (_garbage_lock, "tileship.lock", LockError),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_unloadable_release_is_refused_naming_its_own_file(cpu_release: Path, snapshots: Path, case: str) -> None:
    mutate, name, error = CASES[case]
    mutate(cpu_release)
    bundle.write_manifest(cpu_release)  # every hash matches: only the load can tell
    with pytest.raises(TileshipError) as info:
        load(cpu_release, trusted_keys=[])
    assert isinstance(info.value, error), repr(info.value)
    assert str(cpu_release / name) in info.value.message, info.value.message
    assert "tileship-snapshot-" not in str(info.value) + str(getattr(info.value, "path", "")), str(info.value)
    assert list(snapshots.iterdir()) == [], "the failed load's snapshot was kept"


def test_a_failed_load_keeps_no_snapshot_and_a_good_one_keeps_its_own(cpu_release: Path, snapshots: Path) -> None:
    (cpu_release / "evidence").mkdir()
    (cpu_release / "evidence" / "verification.json").write_text("[]")
    bundle.write_manifest(cpu_release)
    for _ in range(3):  # a server retrying on every reload
        with pytest.raises(BundleIntegrityError, match="not tileship verification evidence"):
            load(cpu_release, trusted_keys=[])
    assert list(snapshots.iterdir()) == []
    (cpu_release / "evidence" / "verification.json").unlink()
    bundle.write_manifest(cpu_release)
    rel = load(cpu_release, trusted_keys=[])
    assert len(list(snapshots.iterdir())) == 1
    rel.close()
    assert list(snapshots.iterdir()) == []
