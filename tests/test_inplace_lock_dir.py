"""Where ``inplace.writing`` keeps its lock files: never through a symlink someone planted, never in a folder
another user owns or can write; a per-user folder instead, and a BundleError naming the folders when neither
is safe (not a raw PermissionError from `tileship sign`, `verify` or `tune`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tileship.errors import BundleError
from tileship.release import inplace

SHARED = "tileship-release-locks"


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp directory standing in for /tmp (``tempfile.gettempdir()``)."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def _own(base: Path) -> Path:
    return base / f"{SHARED}-{os.getuid()}"


def test_a_planted_symlink_is_not_followed_the_lock_goes_to_a_per_user_folder(base: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    (base / SHARED).symlink_to(elsewhere)
    with inplace.writing(tmp_path / "release"):
        assert list(elsewhere.iterdir()) == [], "the lock file went through the planted symlink"
        assert [p.suffix for p in _own(base).iterdir()] == [".lock"]
    assert (_own(base).stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("plant", ["file", "world-writable"])
def test_an_unsafe_shared_folder_falls_back_to_a_per_user_one(base: Path, plant: str) -> None:
    if plant == "file":
        (base / SHARED).write_text("not a folder")
    else:
        (base / SHARED).mkdir()
        (base / SHARED).chmod(0o777)
    assert inplace.lock_dir() == _own(base)


def test_a_safe_shared_folder_is_used(base: Path) -> None:
    assert inplace.lock_dir() == base / SHARED
    assert ((base / SHARED).stat().st_mode & 0o777) == 0o700


def test_no_safe_folder_is_a_bundle_error_naming_each_folder_and_its_problem(base: Path, tmp_path: Path) -> None:
    (base / SHARED).write_text("not a folder")
    _own(base).symlink_to(tmp_path)
    with pytest.raises(BundleError) as info:
        with inplace.writing(tmp_path / "release"):
            pass
    msg = str(info.value)
    assert f"{base / SHARED} is not a directory" in msg and f"{_own(base)} is a symlink" in msg, msg
    assert "TMPDIR" in msg


def test_folders_of_another_user_are_refused_by_owner(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.getuid()
    inplace.lock_dir()                                 # both folders exist, owned by this (real) user
    (base / f"{SHARED}-{real + 1}").mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # now they belong to "another user"
    with pytest.raises(BundleError, match=f"belongs to another user \\(uid {real}\\)"):
        inplace.lock_dir()
