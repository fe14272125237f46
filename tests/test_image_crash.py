"""`tileship image` killed at every write boundary while it replaces a build context for release A
with one for release B: the context is A's whole or B's whole (the Dockerfile, its release copy and
its wheel agree, the copy is intact), never a Dockerfile of one release beside another's files or a
half-copied release (it used to delete ``release/`` and copy the new one in place); the next
`tileship image` leaves no temporary behind. A context directory holding foreign files is refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import crashpoints
from test_toolchain import APT, BASE, GOOD

from tileship.release import bundle, integrity
from tileship.release.image import BaseImage, write_context


def _args(release: Path, req: Path, wheel: Path, out: Path) -> list[str]:
    return ["image", str(release), "-r", str(req), "--wheel", str(wheel), "--base", BASE,
            *[a for n, v in APT.items() for a in ("--apt", f"{n}={v}")], "-o", str(out)]


def _context_release(out: Path) -> str:
    """The release id the context is for; asserts that its parts agree and its copy is whole."""
    text = (out / "Dockerfile").read_text()
    m = re.search(r"TILESHIP_RELEASE_ID=(\w+)", text)
    assert m, text[:300]
    copy = integrity.check(out / "release", trusted_keys=[]).release_id
    assert copy == m.group(1), f"the Dockerfile is for {m.group(1)}, the release copy is {copy}"
    installs = re.findall(r"tileship-[0-9.]+-py3-none-any\.whl", text)
    assert installs and all((out / w).is_file() for w in installs), (installs, "the wheel the Dockerfile installs")
    assert (out / "requirements-serve.txt").read_text() == GOOD
    return copy


def test_image_killed_at_every_write_boundary(cpu_release: Path, tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheel_a, wheel_b = tmp_path / "a" / "tileship-0.1.0-py3-none-any.whl", tmp_path / "tileship-0.2.0-py3-none-any.whl"
    wheel_a.parent.mkdir()
    wheel_a.write_bytes(b"PK-a")
    wheel_b.write_bytes(b"PK-b")
    other = tmp_path / "other"
    shutil.copytree(cpu_release, other)
    data = json.loads((other / "release.json").read_text())
    data["kernel_revision"] = "other-" + str(data.get("kernel_revision"))
    (other / "release.json").write_text(json.dumps(data))
    (other / "manifest.sig").unlink(missing_ok=True)
    a, b = integrity.check(cpu_release, trusted_keys=[]).release_id, bundle.write_manifest(other)["release_id"]
    assert a != b
    out, first = tmp_path / "ctx", tmp_path / "ctx-a"
    total = crashpoints.boundaries(crashpoints.run(_args(cpu_release, req, wheel_a, first), 10**6))
    assert _context_release(first) == a
    seen: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(first, out)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        seen.add(_context_release(out))  # the old context or the new one, whole
        write_context(other, out, BaseImage(BASE, APT), cuda="13.0.88", requirements=req, wheel=wheel_b)  # the next run
        assert _context_release(out) == b
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "a temporary was left"

    outcomes = list(crashpoints.sweep(_args(other, req, wheel_b, out), before=fresh, check=check,
                                      step=max(1, total // 7)))
    assert sum(o.killed for o in outcomes) >= 5 and seen == {a, b}, seen
    assert sorted(p.name for p in out.glob("*.whl")) == [wheel_b.name], "a stale wheel in the context"


def test_image_refuses_a_directory_with_foreign_files(cpu_release: Path, tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheel = tmp_path / "tileship-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    out = tmp_path / "ctx"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = subprocess.run([sys.executable, "-m", "tileship.cli", *_args(cpu_release, req, wheel, out)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "notes.txt" in r.stdout + r.stderr, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def test_image_out_through_a_symlink_replaces_the_folder_it_names_and_keeps_the_link(cpu_release: Path,
                                                                                       tmp_path: Path) -> None:
    """``tileship image -o LINK`` where LINK is a symlink to a context directory: the swap exchanged the link itself
    with the staged directory, so LINK became a plain directory, the folder it named kept the old context, and the
    old link was left as a ``.LINK.tmp<pid>`` beside it (rmtree refuses a symlink). The folder the link names is
    now replaced, as ``tileship report -o`` does (``swap.staged``)."""
    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheel = tmp_path / "tileship-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    real = tmp_path / "shared" / "ctx"
    real.mkdir(parents=True)
    (real / "Dockerfile").write_text("FROM old\n")
    link = tmp_path / "ctx"
    link.symlink_to(real)
    path = write_context(cpu_release, link, BaseImage(BASE, APT), cuda="13.0.88", requirements=req, wheel=wheel)
    assert link.is_symlink(), "the link was replaced by a directory"
    assert _context_release(real) == integrity.check(cpu_release, trusted_keys=[]).release_id
    assert path == link / "Dockerfile" and path.read_text() == (real / "Dockerfile").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "a temporary was left"
    assert sorted(p.name for p in real.parent.iterdir()) == ["ctx"], "a temporary was left"


def test_image_refuses_an_out_that_is_a_file(cpu_release: Path, tmp_path: Path) -> None:
    """A file at ``-o`` was exchanged with the staged directory and left as ``.NAME.tmp<pid>``; it is refused."""
    import pytest

    from tileship.errors import BuildError

    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheel = tmp_path / "tileship-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    out = tmp_path / "ctx"
    out.write_text("my notes")
    with pytest.raises(BuildError, match="not a directory"):
        write_context(cpu_release, out, BaseImage(BASE, APT), cuda="13.0.88", requirements=req, wheel=wheel)
    assert out.read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
