"""``swap.staged`` (``tileship report -o``, ``tileship image -o``) makes what it stages durable before it renames it
into place: every file and folder of the staged tree is fsynced before the rename, and the directory the rename
changed after it.

Before: the staged files were renamed into place without an fsync. A killed process was safe (the kernel keeps
the page cache), a power loss was not: the new names could reach the disk before the files' bytes, leaving an
empty ``index.html`` or a short ``release/`` copy in the new context under the final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tileship.release import swap


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths every ``os.fsync`` of this test was called on, in order (read from the descriptor)."""
    seen: list[Path] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _stage(tmp: Path) -> None:
    (tmp / "index.html").write_text("<html>new</html>")
    (tmp / "plots").mkdir()
    (tmp / "plots" / "a.png").write_bytes(b"\x89PNG new")


@pytest.mark.parametrize("foreign", [False, True], ids=["whole-folder-swap", "file-by-file-beside-foreign-files"])
def test_everything_staged_is_fsynced_before_the_rename_and_the_renamed_directory_after(tmp_path, synced, foreign):
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("<html>old</html>")
    if foreign:  # a file tileship did not write: the new files replace their namesakes one by one
        (out / "notes.txt").write_text("mine")
    with swap.staged(out, lambda name: name in ("index.html", "plots"), last="index.html") as tmp:
        _stage(tmp)
        staged = [tmp / "index.html", tmp / "plots" / "a.png", tmp / "plots", tmp]
    # fsynced under the staged names: before any rename moved them (after it, those names no longer exist)
    missing = [p for p in staged if p.resolve() not in synced]
    assert not missing, f"not fsynced before the rename: {missing} (fsynced: {synced})"
    after = out.resolve() if foreign else tmp_path.resolve()  # the directory whose entries the rename changed
    assert after in synced[synced.index(tmp.resolve()) + 1:], (after, synced)
    assert (out / "index.html").read_text() == "<html>new</html>" and (out / "plots" / "a.png").is_file()
    assert (out / "notes.txt").exists() == foreign


def test_a_staged_symlink_is_not_followed_or_opened(tmp_path, synced):
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not ours")
    out = tmp_path / "ctx"
    with swap.staged(out, lambda name: True, last="Dockerfile") as tmp:
        (tmp / "Dockerfile").write_text("FROM x")
        (tmp / "link").symlink_to(elsewhere)
    assert elsewhere.resolve() not in synced and (tmp_path / "ctx" / "Dockerfile").resolve() not in synced
    assert any(p.name == "Dockerfile" for p in synced), synced


def test_an_image_context_is_fsynced_file_by_file_before_it_is_put_in_place(cpu_release, tmp_path, synced):
    from test_toolchain import APT, BASE, GOOD

    from tileship.release.image import BaseImage, write_context

    req, wheel = tmp_path / "req.txt", tmp_path / "tileship-0.1.0-py3-none-any.whl"
    req.write_text(GOOD)
    wheel.write_bytes(b"PK")
    out = tmp_path / "ctx"
    write_context(cpu_release, out, BaseImage(BASE, APT), cuda="13.0.88", requirements=req, wheel=wheel)
    top = tmp_path.resolve()
    rels = [p.relative_to(top).parts for p in synced if p.is_relative_to(top)]
    # paths inside the staged folder (.ctx.tmp<pid>-<hex>)
    staged = {Path(*parts[1:]) for parts in rels if parts and parts[0].startswith(".ctx.tmp")}
    want = {p.relative_to(out) for p in out.rglob("*")} | {Path()}
    assert len(want) > 10 and want <= staged, sorted(map(str, want - staged))[:10]
