"""Registry durability: kill -9 at random instants of every change, and a full disk (small tmpfs).

Trials per operation: 30 by default, ``TILESHIP_CRASH_TRIALS=200`` for the issue's full run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tileship.errors import RegistryError
from tileship.release import bundle
from tileship.release.registry import Registry

SRC = str(Path(__file__).resolve().parent.parent / "src")
TRIALS = int(os.environ.get("TILESHIP_CRASH_TRIALS", "30"))
LEFTOVER = re.compile(r"\.tmp|^\.incoming-|^\.trash-|^\.unpack-|^\.active\.tmp-")

CHILD = textwrap.dedent("""
    import json, sys
    from tileship.release.registry import Registry
    op, root, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    reg = Registry(root)
    print("ready", flush=True)
    i = 0
    while True:
        if op == "publish":
            reg.publish(args[i % len(args)])
        elif op == "replace":
            reg.publish(args[i % 2], replace=True)
        elif op == "activate":
            reg.activate(args[i % 2])
        elif op == "rollback":
            reg.activate(args[1]) if i % 2 == 0 else reg.rollback()
        elif op == "reference":
            reg.activate_reference(args[0]) if i % 2 == 0 else reg.activate(args[1])
        i += 1
""")


def fake_release(where: Path, tag: str, evidence: str | None = None) -> Path:
    root = where / f"bundle-{tag}"
    (root / "specs" / "x").mkdir(parents=True)
    (root / "release.json").write_text(json.dumps({"model": {"name": "m", "version": tag}, "kernel_revision": tag}))
    (root / "specs" / "x" / "lib.so").write_bytes(tag.encode()[:1] * 20000)
    if evidence:
        (root / "evidence").mkdir()
        (root / "evidence" / "build-note.json").write_text(json.dumps({"note": evidence}))
    bundle.write_manifest(root)
    return root


def assert_consistent(reg: Registry) -> None:
    """The pointer names a complete release (or nothing); every history entry exists."""
    active = reg.active()
    if active.release_id is not None:
        assert active.path is not None and active.path.is_dir(), f"pointer names a missing release {active}"
        bundle.check_integrity(active.path)
    for h in reg.history():
        bundle.check_integrity(reg.path_of(h["release_id"]))


def leftovers(reg: Registry) -> list[str]:
    found = [p.name for d in (reg.root, reg.releases_dir) if d.is_dir() for p in d.iterdir() if LEFTOVER.search(p.name)]
    ids = [p.name.partition("@")[0] for p in reg.releases_dir.iterdir() if not p.name.startswith(".")]
    return found + [f"duplicate copy of {i}" for i in set(ids) if ids.count(i) > 1]


def _trial(op: str, where: Path, seed: int) -> bool:
    """One kill; returns whether the child was still running (mid-operation) when killed."""
    rnd = random.Random(seed)
    reg = Registry(where / "reg")
    a, b = fake_release(where, "a"), fake_release(where, "b")
    ra, rb = reg.publish(a), reg.publish(b)
    if op == "publish":
        args = [str(fake_release(where, f"p{i}")) for i in range(8)]
    elif op == "replace":
        reg.activate(ra)
        args = [str(fake_release(where / "e1", "a", "one")), str(fake_release(where / "e2", "a", "two"))]
    else:
        reg.activate(ra)
        args = [ra, rb]
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, op, str(reg.root), json.dumps(args)],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(rnd.uniform(0.0, 0.08))
    running = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_consistent(reg)
    reg.activate(ra, force=True)  # the next operation cleans what the kill left
    assert leftovers(reg) == [], f"{op}: leftovers after the next operation"
    assert_consistent(reg)
    return running


@pytest.mark.parametrize("op", ["publish", "replace", "activate", "rollback", "reference"])
def test_kill_9_at_random_instants(op: str, tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: _trial(op, tmp_path / f"t{i}", i), range(TRIALS)))
    print(f"\n{op}: {TRIALS} kills, {sum(results)} mid-operation, 0 inconsistent states, 0 leftovers")
    assert sum(results) >= TRIALS * 0.8, "the kills must land while the child is working"


def test_replace_of_the_active_release_keeps_a_valid_copy_at_every_step(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(fake_release(tmp_path / "1", "a", "one"))
    reg.activate(rid)
    assert reg.publish(fake_release(tmp_path / "2", "a", "two"), replace=True) == rid
    assert reg.path_of(rid).name == f"{rid}@1" and reg.active().path == reg.path_of(rid)
    assert json.loads((reg.path_of(rid) / "evidence" / "build-note.json").read_text())["note"] == "two"
    assert leftovers(reg) == []


@pytest.fixture
def tmpfs(tmp_path: Path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip() or r.returncode}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk(tmpfs: Path, tmp_path: Path) -> None:
    reg = Registry(tmpfs / "reg")
    a, b = reg.publish(fake_release(tmp_path, "a")), reg.publish(fake_release(tmp_path, "b"))
    reg.activate(a)
    reg.activate(b)
    with open(tmpfs / "filler", "wb", buffering=0) as f:  # fill the disk
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    before = (reg.active(), reg.history(), sorted(p.name for p in reg.releases_dir.iterdir()))
    with pytest.raises(RegistryError, match="disk is full") as info:
        reg.publish(fake_release(tmp_path, "c"))
    assert "Traceback" not in str(info.value)
    assert (reg.active(), reg.history(), sorted(p.name for p in reg.releases_dir.iterdir())) == before
    assert leftovers(reg) == []
    assert reg.activate_reference().reference_only  # the last line of defence works on a full disk
    assert reg.rollback().release_id == b and not reg.active().reference_only
    assert reg.rollback().release_id == a
    assert_consistent(reg)
