"""`tileship diagnose` killed at write boundaries: bundles written before stay whole, no ``<id>`` folder ever lacks
its ``summary.json``, and the next run cleans what the killed one left (its staging folder ``.<id>.tmp<pid>``, a
half archive ``<id>.tar.gz.tmp<pid>``) and archives a whole bundle left without its archive. Before: a killed run
left a ``<id>`` folder with no summary and no archive that only a server's retention (``CaptureQueue.prune``)
ever removed. Retention still removes a bundle with every part of it, those an older tileship left included."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import crashpoints

from tileship.release.diagnostics_queue import CaptureQueue, bundle_parts


def _bundles(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.glob("*.tar.gz")}


def _whole(out: Path) -> None:
    """Every bundle a folder with its summary and a complete archive, nothing else."""
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert sorted(p.name for p in out.iterdir()) == sorted([*folders, *(f + ".tar.gz" for f in folders)]), \
        sorted(p.name for p in out.iterdir())
    for f in folders:
        assert (out / f / "summary.json").is_file()
        with tarfile.open(out / f"{f}.tar.gz") as tar:
            assert f"{f}/summary.json" in tar.getnames(), f


def test_diagnose_killed_at_write_boundaries_then_settled(cpu_release: Path, tmp_path: Path) -> None:
    out = tmp_path / "diag"
    args = ["diagnose", str(cpu_release), "--out", str(out), "--no-load"]
    crashpoints.run(args, 10**6)  # makes the folder: later runs have one boundary less
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    left: set[str] = set()
    for n in [3, total // 2, total - 1]:  # writing the bundle's files (its first few), then its archive
        before = _bundles(out)
        o = crashpoints.run(args, n)
        assert o.killed, o.output[-2000:]
        assert {k: v for k, v in _bundles(out).items() if k in before} == before, f"boundary {n}: an old bundle moved"
        for p in out.iterdir():
            assert not p.is_dir() or p.name.startswith(".") or (p / "summary.json").is_file(), \
                f"boundary {n}: {p.name} has no summary.json"
            if p.name.startswith("."):
                left.add("staging folder")
            elif ".tar.gz.tmp" in p.name:
                left.add("half archive")
            elif p.is_dir() and not (out / f"{p.name}.tar.gz").exists():
                left.add("bundle without its archive")
        done = crashpoints.run(args, 10**6)  # the next run: whole, and what the killed one left is gone
        assert done.returncode == 0, done.output[-2000:]
        _whole(out)
    assert left == {"staging folder", "half archive", "bundle without its archive"}, left  # each case was met


def test_retention_removes_every_part_and_skips_a_live_writer(tmp_path: Path) -> None:
    out = tmp_path / "diag"
    out.mkdir()
    for i, parts in enumerate([("", ".tar.gz"), ("", ".tar.gz.tmp"), ("",), (".tar.gz.tmp99999999",)]):
        for suffix in parts:  # an older tileship's leftovers too: a folder without summary, a half archive
            p = out / f"diag-2026010{i}T000000Z-00000{i}{suffix}"
            p.mkdir() if suffix == "" else p.write_bytes(b"x")
            os.utime(p, (i, i))
    live = out / f".diag-20260109T000000Z-000009.tmp{os.getpid()}"  # being written by this process
    live.mkdir()
    (out / "notes.txt").write_text("mine")
    assert sorted(bundle_parts(out)) == [f"diag-2026010{i}T000000Z-00000{i}" for i in range(4)]
    q = CaptureQueue(out, keep=1, keep_bytes=1 << 30)
    try:
        assert q.prune() == [f"diag-2026010{i}T000000Z-00000{i}" for i in range(2)]
    finally:
        q.close()
    assert sorted(p.name for p in out.iterdir()) == [live.name, "diag-20260102T000000Z-000002", "notes.txt"]
