"""Commands that read a release's files without loading it (``explain``, ``report``, ``verify``, ``tune``) on a
release whose ``release.json`` or evidence is a FIFO or a link to ``/dev/zero``: an error naming the file, at once.
Before: ``tileship explain`` blocked for good on a FIFO (``described.read`` and ``evidence.read`` opened it with
``read_bytes``, which waits for a writer). A project file that is no regular file is refused, not passed over."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from threads import within
from typer.testing import CliRunner

from tileship.cli import app
from tileship.errors import BundleIntegrityError
from tileship.release import described, evidence


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["release.json", "evidence/verification.json"])
def test_explain_names_a_release_file_that_is_no_small_file(cpu_release: Path, name: str, kind: str) -> None:
    _plant(cpu_release / name, kind)
    res = within(lambda: CliRunner().invoke(app, ["explain", str(cpu_release), "add", "N=4096"]))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    assert f"{name.rpartition('/')[2]}:cannotread" in "".join(res.output.split()), res.output


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_the_readers_raise_an_integrity_error_naming_the_file(tmp_path: Path, kind: str) -> None:
    for path, read in ((tmp_path / "release.json", described.read),
                       (tmp_path / evidence.EVIDENCE, lambda _: evidence.read(tmp_path))):
        if kind == "directory":
            path.mkdir(parents=True)
        else:
            _plant(path, kind)
        exc = within(lambda: read(path))
        assert isinstance(exc, BundleIntegrityError) and exc.message.startswith(f"{path}: cannot read"), repr(exc)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("given", ["file", "folder"])
def test_a_project_file_that_is_no_regular_file_is_refused_not_skipped(tmp_path: Path, kind: str, given: str) -> None:
    """Before: a ``tileship.toml`` that was a FIFO or a link to /dev/zero was passed over (``is_file`` is False), so
    ``--project`` on it, or a build from its folder, quietly used the built-in catalog instead."""
    from tileship.declare.project import find_project
    from tileship.errors import DeclarationError

    _plant(tmp_path / "tileship.toml", kind)
    exc = within(lambda: find_project(tmp_path / "tileship.toml" if given == "file" else tmp_path))
    assert isinstance(exc, DeclarationError) and f"{tmp_path / 'tileship.toml'}: not a regular file" in exc.message, \
        repr(exc)
