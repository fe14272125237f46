"""Writers in threads of one process replacing the same file or folder at once (a server's threads, a library
caller's pool). Each writer used to build its temporary from the process id alone (``<name>.tmp<pid>``), so threads
shared it: one truncated or removed another's half-written temporary, renamed it away under it (FileNotFoundError),
or published a mix of two writers' bytes. Now every writer has a temporary of its own (``atomic_file.temporary``:
``<name>.tmp<pid>-<random>``) and each call replaces the target with one writer's whole content."""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import tarfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_image_crash import _context_release
from test_keygen_crash import _pub_of_private
from test_toolchain import APT, BASE, GOOD
from test_toolchain_lock_crash import _fake_piptools

from tileship.build.toolchain import check_hashed, compile_requirements
from tileship.errors import SignatureError
from tileship.release import bundle, diagnostics_queue, inplace, integrity, keys, swap
from tileship.release.image import BaseImage, write_context

WRITERS = 8


def _at_once(fn: Callable[[int], Any], n: int = WRITERS) -> list[Any]:
    """``fn(0)`` .. ``fn(n - 1)``, each in its own thread, released together; what each returned or raised."""
    start = threading.Barrier(n)

    def run(i: int) -> Any:
        start.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run, i) for i in range(n)]
    return [f.exception() or f.result() for f in futures]


def _all_succeeded(results: list[Any]) -> None:
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of {len(results)} writers failed: {failed[:3]}"


def _temporaries(*folders: Path) -> list[str]:
    return sorted(p.name for d in folders for p in d.iterdir() if ".tmp" in p.name or p.name.startswith(".trash-"))


def test_threads_replacing_one_release_file_each_write_it_whole(tmp_path: Path) -> None:
    """``inplace.write_atomic`` (a manifest, a signature, a server's ``--generation-state`` record)."""
    path = tmp_path / "manifest.json"
    bodies = [(f"writer {i}\n" * (400 + 250 * i)).encode() for i in range(WRITERS)]

    def write(i: int) -> None:
        for _ in range(25):
            inplace.write_atomic(path, bodies[i])
            assert path.read_bytes() in bodies, "a mix of two writers' bytes"

    _all_succeeded(_at_once(write))
    assert path.read_bytes() in bodies
    assert _temporaries(tmp_path) == [], "a temporary was left"


def test_threads_generating_one_key_leave_one_whole_pair(tmp_path: Path) -> None:
    """``keys.generate_key``: one writer wins, the others are told a key exists (keygen never overwrites one); the
    private key and its public half are one pair. Before: a writer truncated the temporary another had already
    linked as the private key (a key beside another key's public half), or lost its temporary to another's cleanup
    ("cannot write the key")."""
    for n in range(8):
        key = tmp_path / f"k{n}.pem"
        results = _at_once(lambda i: keys.generate_key(key))
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert won == [keys.public_path(key)], results
        assert all(isinstance(e, SignatureError) and "exists" in e.message for e in lost), lost
        assert keys.public_path(key).read_bytes() == _pub_of_private(key), "a private key beside another's public key"
        assert key.stat().st_mode & 0o077 == 0
    assert _temporaries(tmp_path) == [], "a temporary was left"


def test_threads_staging_one_folder_each_put_a_whole_one(tmp_path: Path) -> None:
    """``swap.staged`` (``tileship report -o``): every folder put in place is one writer's, page and plot."""
    out = tmp_path / "out"

    def write(i: int) -> None:
        for _ in range(10):
            with swap.staged(out, lambda name: name in ("index.html", "plot.png"), last="index.html") as tmp:
                (tmp / "plot.png").write_bytes(bytes([i]) * 300_000)
                (tmp / "index.html").write_text(f"writer {i}\n")

    _all_succeeded(_at_once(write))
    i = int((out / "index.html").read_text().split()[1])
    assert (out / "plot.png").read_bytes() == bytes([i]) * 300_000, "the page of one writer beside another's plot"
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "plot.png"]
    assert _temporaries(tmp_path) == [], "a staging folder was left"


def test_threads_putting_folders_at_one_new_place_each_put_a_whole_one(tmp_path: Path) -> None:
    """``swap.replace_dir`` onto a path that did not exist when each writer looked: the first rename wins, the others
    swap with it. Before: they failed (ENOTEMPTY: the plain rename cannot replace the first writer's folder)."""
    for n in range(20):
        dest = tmp_path / f"out{n}"
        staged = [tmp_path / f".out{n}.staged{i}" for i in range(WRITERS)]
        for i, d in enumerate(staged):
            d.mkdir()
            (d / "who").write_text(str(i))
        _all_succeeded(_at_once(lambda i: swap.replace_dir(staged[i], dest)))
        assert sorted(p.name for p in dest.iterdir()) == ["who"] and int((dest / "who").read_text()) in range(WRITERS)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"out{n}" for n in range(20)), "a folder was left"


def test_threads_writing_one_image_context_each_put_a_whole_one(cpu_release: Path, tmp_path: Path) -> None:
    """``image.write_context``: the Dockerfile, the wheel it installs and the release copy are one writer's."""
    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheels = [tmp_path / f"tileship-0.1.{i}-py3-none-any.whl" for i in range(WRITERS)]
    for w in wheels:
        w.write_bytes(b"PK-" + w.name.encode())
    out = tmp_path / "ctx"
    results = _at_once(lambda i: write_context(cpu_release, out, BaseImage(BASE, APT), cuda="13.0.88",
                                               requirements=req, wheel=wheels[i]))
    _all_succeeded(results)
    assert _context_release(out) == integrity.check(cpu_release, trusted_keys=[]).release_id
    assert len(list(out.glob("*.whl"))) == 1, "wheels of two writers in one context"
    assert _temporaries(tmp_path) == [], "a staging folder was left"


def test_threads_archiving_one_diagnostics_bundle_each_write_it_whole(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """``diagnostics_queue.settle`` (every capture and every prune runs it): a bundle left without its archive is
    archived by each settle that finds it at once; each writes its own archive. Before: they wrote one temporary,
    so the archive was a mix of several writers' streams, or a writer lost its temporary ("could not archive")."""
    did = "diag-20260101T000000Z-abcdef"
    folder = tmp_path / did
    folder.mkdir()
    files = {"summary.json": b"{}\n", "data.bin": os.urandom(3 << 20), "log.txt": b"line\n" * 50_000}
    for name, body in files.items():
        (folder / name).write_bytes(body)
    caplog.set_level(logging.WARNING, logger="tileship.release.diagnostics")
    for _ in range(3):
        (tmp_path / f"{did}.tar.gz").unlink(missing_ok=True)
        _all_succeeded(_at_once(lambda i: diagnostics_queue.settle(tmp_path)))
        assert not [r.getMessage() for r in caplog.records], "a writer failed"
        with tarfile.open(fileobj=io.BytesIO((tmp_path / f"{did}.tar.gz").read_bytes()), mode="r:gz") as tar:
            got = {Path(m.name).name: _read(tar, m) for m in tar.getmembers() if m.isfile()}
        assert got == files, "the archive is not the bundle's files"
    assert sorted(p.name for p in tmp_path.iterdir()) == [did, f"{did}.tar.gz"], "a temporary was left"


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    assert f is not None
    return f.read()


_RESOLVING_SLOWLY = """
import sys, time
src, out = sys.argv[-1], sys.argv[sys.argv.index("--output-file") + 1]
name = open(src).read().split()[0]
with open(out, "w") as f:
    for i in range(200):
        f.write(name + "-" + str(i) + "==1.0 \\\\\\n    --hash=sha256:" + "a" * 64 + "\\n")
        f.flush()
        if i % 20 == 0:
            time.sleep(0.005)
"""


def test_threads_locking_one_toolchain_file_each_write_a_whole_resolution(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``toolchain.compile_requirements``: each call resolves its own requirements into a temporary of its own and
    returns that resolution; the file is one of them. Before: the calls shared the input and output temporaries
    (pip-compile resolving another call's requirements, two pip-compiles writing one file, a temporary removed
    under another call)."""
    out = tmp_path / "toolchain.txt"
    out.write_text(GOOD)
    _fake_piptools(tmp_path, monkeypatch, _RESOLVING_SLOWLY)
    results = _at_once(lambda i: compile_requirements([f"pkg{i}"], out))
    _all_succeeded(results)
    for i, text in enumerate(results):
        assert re.findall(r"^(pkg[0-9]+)-", text, re.M) == [f"pkg{i}"] * 200, f"call {i} got another resolution"
    assert out.read_text() in results and check_hashed(out.read_text()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", out.name], "a temporary was left"


def test_threads_copying_one_release_to_one_place_leave_a_whole_copy(cpu_release_build: Any, tmp_path: Path) -> None:
    """``bundle.copy_release`` (the registry's publish holds its lock; a library caller may not): the first complete
    copy is renamed into place, the others are refused (the place is taken: ENOTEMPTY) and removed. Before: each
    call first removed the shared temporary, so a writer's copy was deleted under it, or renamed into place while
    another was still copying into it."""
    dest = tmp_path / "copy"
    results = _at_once(lambda i: bundle.copy_release(cpu_release_build.path, dest))
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) < len(results)
    assert all(isinstance(e, OSError) and e.errno in (errno.ENOTEMPTY, errno.EEXIST) for e in failed), failed
    assert integrity.check(dest, trusted_keys=[]).release_id == cpu_release_build.release_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"], "a temporary was left"
