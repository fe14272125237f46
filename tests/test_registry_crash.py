"""Registry durability: kill -9 at random instants of every change, and a full disk (small tmpfs).

The trials are ``benchmarks/registry_crash_trials.py``'s (which runs 200 per operation and commits its
result): here 20 per operation in CI, bounded to 45 s each, ``TILESHIP_CRASH_TRIALS`` for more.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tileship.errors import RegistryError
from tileship.release.registry import Registry

_spec = importlib.util.spec_from_file_location(
    "registry_crash_trials", Path(__file__).resolve().parents[1] / "benchmarks" / "registry_crash_trials.py")
assert _spec is not None and _spec.loader is not None
crash = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = crash  # its dataclasses look their module up
_spec.loader.exec_module(crash)
fake_release, leftovers = crash.fake_release, crash.leftovers
TRIALS = int(os.environ.get("TILESHIP_CRASH_TRIALS", "20"))


def assert_consistent(reg: Registry) -> None:
    """The pointer names a complete release (or nothing); every history entry exists."""
    assert crash.inconsistency(reg) is None, crash.inconsistency(reg)


@pytest.mark.parametrize("op", crash.OPS)
def test_kill_9_at_random_instants(op: str, tmp_path: Path) -> None:
    """Every kill leaves a pointer that names a complete release; the next operation (activate on
    even trials, ``tileship gc`` on odd ones) leaves no temporary and no superseded copy."""
    s, trials = crash.run(op, TRIALS, tmp_path, workers=4, budget_s=45.0)
    print(f"\n{op}: {s.trials} kills, {s.mid_operation} mid-operation, {s.left_by_kill} left temporaries, "
          f"{s.inconsistent} inconsistent, {s.leftovers_after_next} with leftovers after the next operation")
    assert s.trials >= min(TRIALS, 10), f"only {s.trials} trials within the time bound"
    assert s.inconsistent == 0 and s.leftovers_after_next == 0, s.failures
    assert s.mid_operation >= s.trials * 0.8, "the kills must land inside an operation"
    assert s.left_by_kill >= 1, "no kill left a temporary: the cleanup was not exercised"
    assert {t.next_operation for t in trials} == {"activate", "gc"}


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


def fill(mnt: Path) -> None:
    with open(mnt / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_full_disk_through_the_cli(tmpfs: Path, tmp_path: Path) -> None:
    """What an operator sees: `tileship publish` (a directory, a `tileship pack` archive, `--replace` of
    the active release) exits 1 naming the full disk, with no traceback, and changes nothing;
    `tileship activate --reference` and `tileship rollback` exit 0 on the same full disk."""
    from typer.testing import CliRunner

    from tileship.cli import app
    from tileship.release import bundle

    reg = Registry(tmpfs / "reg")
    a = reg.publish(fake_release(tmp_path / "1", "a", "one"))
    b = reg.publish(fake_release(tmp_path / "1", "b"))
    reg.activate(a)
    reg.activate(b)
    archive = bundle.pack(fake_release(tmp_path / "2", "c"), tmp_path / "c.tar.gz")
    fill(tmpfs)
    before = (reg.active(), reg.history(), sorted(p.name for p in reg.releases_dir.iterdir()))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        r = runner.invoke(app, [*args, "--registry", str(reg.root)], catch_exceptions=False)
        return r.exit_code, r.output

    for args in ([str(fake_release(tmp_path / "3", "d"))], [str(archive)],
                 [str(fake_release(tmp_path / "4", "a", "two")), "--replace"]):
        code, out = run("publish", *args)
        assert code == 1 and "disk is full" in out and "Traceback" not in out, (args, out)
        assert (reg.active(), reg.history(), sorted(p.name for p in reg.releases_dir.iterdir())) == before, args
        assert leftovers(reg) == [], args
    code, out = run("activate", "--reference")
    assert code == 0 and "reference only" in out, out
    code, out = run("rollback")
    assert code == 0 and f"active: {b}" in out and "reference only" not in out, out
    code, out = run("rollback")
    assert code == 0 and f"active: {a}" in out, out
    assert_consistent(reg)
