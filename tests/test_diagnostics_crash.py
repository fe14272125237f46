"""`tileship diagnose` killed at write boundaries: bundles written before stay whole, the next run writes a whole
bundle, and what a killed run left (a bundle folder without its archive, a half archive ``<id>.tar.gz.tmp``) is
removed by the server's retention (``CaptureQueue.prune``) with its bundle. Before: the half archive's name did
not map to its bundle's id, so pruning never removed it (its bytes counted against ``keep_bytes`` for good)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import crashpoints

from tileship.release.diagnostics_queue import CaptureQueue


def _bundles(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.glob("*.tar.gz")}


def test_diagnose_killed_at_write_boundaries_then_pruned(cpu_release: Path, tmp_path: Path) -> None:
    out = tmp_path / "diag"
    args = ["diagnose", str(cpu_release), "--out", str(out), "--no-load"]
    crashpoints.run(args, 10**6)  # makes the folder: later runs have one boundary less
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    before = _bundles(out)
    assert len(before) == 2
    kills = [1, total // 2, *range(total - 4, total)]  # the archive is written last
    for n in kills:
        o = crashpoints.run(args, n)
        assert o.killed, o.output[-2000:]
        assert {k: v for k, v in _bundles(out).items() if k in before} == before, f"boundary {n}: an old bundle moved"
    assert list(out.glob("*.tar.gz.tmp")), "no kill landed in the archive (the test no longer covers it)"
    done = crashpoints.run(args, 10**6)
    assert done.returncode == 0, done.output[-2000:]
    for name in _bundles(out):
        with tarfile.open(out / name) as tar:
            assert any(m.name.endswith("summary.json") for m in tar.getmembers()), name
    q = CaptureQueue(out, keep=1, keep_bytes=1 << 30)
    try:
        q.prune()
    finally:
        q.close()
    left = sorted(p.name for p in out.iterdir())
    newest = sorted(n for n in _bundles(out))[-1].removesuffix(".tar.gz")
    assert left == [newest, newest + ".tar.gz"], left
