"""The registry: publish, atomic activation (kill -9 loop), serialized writers, refusals, rollback, CLI."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tileship.errors import BundleError, BundleIntegrityError, RegistryError
from tileship.release import bundle
from tileship.release.registry import HISTORY_LIMIT, POINTER, Active, Registry

SRC = str(Path(__file__).resolve().parent.parent / "src")


def fake_release(where: Path, tag: str) -> tuple[Path, str]:
    """A tiny but valid bundle (the registry never loads native code): manifest + release.json."""
    root = where / f"bundle-{tag}"
    (root / "specs" / "x").mkdir(parents=True)
    (root / "release.json").write_text(json.dumps({"model": {"name": "m", "version": tag},
                                                   "kernel_revision": f"rev{tag}"}))
    (root / "specs" / "x" / "lib.so").write_bytes(tag.encode() * 100)
    return root, bundle.write_manifest(root)["release_id"]


def add_evidence(root: Path, passed: dict[str, bool]) -> None:
    (root / "evidence").mkdir(exist_ok=True)
    (root / "evidence" / "verification.json").write_text(json.dumps(
        {"device": {"name": "NVIDIA H200"}, "specializations": {s: {"passed": p} for s, p in passed.items()}}))
    bundle.write_manifest(root)


@pytest.fixture
def two(tmp_path: Path) -> tuple[Registry, str, str]:
    reg = Registry(tmp_path / "reg")
    a = reg.publish(fake_release(tmp_path, "a")[0])
    b = reg.publish(fake_release(tmp_path, "b")[0])
    return reg, a, b


def test_empty_registry_has_nothing_active(tmp_path: Path) -> None:
    assert Registry(tmp_path / "none").active() == Active(None, None, False, None)
    assert Registry(tmp_path / "none").releases() == []


def test_publish_copies_checks_and_is_idempotent(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    reg = Registry(tmp_path / "reg")
    assert reg.publish(src) == rid
    assert bundle.check_integrity(reg.path_of(rid))["release_id"] == rid
    assert reg.publish(src) == rid  # same content again: no-op
    [info] = reg.releases()
    assert (info.release_id, info.integrity_ok, info.verification, info.active,
            info.model) == (rid, True, "unverified", False, "m:a")


def test_publish_of_a_packed_archive(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    archive = bundle.pack(src, tmp_path / "a.tar.gz")
    reg = Registry(tmp_path / "reg")
    assert reg.publish(archive) == rid
    assert [p.name for p in (tmp_path / "reg").iterdir() if p.name.startswith(".unpack")] == []


def test_publish_refuses_what_is_not_a_release(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(RegistryError, match=r"notes\.txt: not a release directory or a `tileship pack` archive"):
        reg.publish(tmp_path / "notes.txt")
    with pytest.raises(BundleError, match="no such release directory"):
        reg.publish(tmp_path / "missing")


def test_publish_refuses_a_tampered_bundle_naming_the_file(tmp_path: Path) -> None:
    src, _ = fake_release(tmp_path, "a")
    (src / "specs" / "x" / "lib.so").write_bytes(b"evil")
    reg = Registry(tmp_path / "reg")
    with pytest.raises(BundleIntegrityError, match=r"lib\.so"):
        reg.publish(src)
    assert reg.releases() == []


def test_republish_with_new_evidence_needs_replace(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    reg = Registry(tmp_path / "reg")
    reg.publish(src)
    add_evidence(src, {"x": True})
    with pytest.raises(RegistryError, match="already published"):
        reg.publish(src)
    assert reg.publish(src, replace=True) == rid
    assert reg.releases()[0].verification == "passed"


def test_activate_rollback_and_reference_only(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    # "none": the evidence pin of a release without evidence (tests/test_evidence_pin.py)
    assert reg.activate(a) == Active(a, reg.releases_dir / a, False, None, "none")
    assert reg.activate(b) == Active(b, reg.releases_dir / b, False, a, "none")
    assert reg.activate(b).previous == a  # activating the active one again records nothing
    ref = reg.activate_reference()
    assert (ref.release_id, ref.reference_only, ref.previous) == (b, True, b)
    assert reg.rollback() == Active(b, reg.releases_dir / b, False, a, "none")
    assert reg.rollback() == Active(a, reg.releases_dir / a, False, None, "none")
    with pytest.raises(RegistryError, match="nothing to roll back"):
        reg.rollback()
    assert [r.active for r in reg.releases() if r.release_id == a] == [True]


def test_activate_by_unique_prefix_and_clear_errors(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    prefix = next(a[:n] for n in range(1, 17) if not b.startswith(a[:n]))
    assert reg.activate(prefix).release_id == a
    with pytest.raises(RegistryError, match="no release 'ffffffffffffffff'"):
        reg.activate("ffffffffffffffff")
    with pytest.raises(RegistryError, match="not a release id"):
        reg.activate("../etc")
    with pytest.raises(RegistryError, match="no release is active"):
        Registry(reg.root.parent / "empty").activate_reference()


def test_tampered_release_cannot_be_activated_without_force(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    reg.activate(a)
    (reg.path_of(b) / "specs" / "x" / "lib.so").write_bytes(b"flipped")
    with pytest.raises(RegistryError, match=r"refusing to activate .*integrity.*lib\.so") as e:
        reg.activate(b)
    assert "--force" in (e.value.hint or "")
    assert reg.active().release_id == a  # unchanged
    assert reg.activate(b, force=True).release_id == b
    assert [r.integrity_ok for r in reg.releases() if r.release_id == b] == [False]


def test_failed_verification_cannot_be_activated_without_force(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    add_evidence(src, {"gemm.float16.M1-8192": False, "rmsnorm.float16.M4096": True})
    reg = Registry(tmp_path / "reg")
    reg.publish(src)
    with pytest.raises(RegistryError, match=r"verification failed: 1 of 2 .*gemm\.float16\.M1-8192"):
        reg.activate(rid)
    assert reg.active().release_id is None
    assert reg.activate(rid, force=True).release_id == rid
    assert reg.releases()[0].verification == "failed"


def test_rollback_refuses_a_release_broken_since(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    reg.activate(a)
    reg.activate(b)
    (reg.path_of(a) / "release.json").write_text("{}")
    with pytest.raises(RegistryError, match="integrity"):
        reg.rollback()
    assert reg.rollback(force=True).release_id == a


def test_history_is_bounded(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    for i in range(HISTORY_LIMIT + 10):
        reg.activate(a if i % 2 else b)
    assert len(reg.history()) == HISTORY_LIMIT


def test_corrupt_pointer_is_reported(two: tuple[Registry, str, str]) -> None:
    reg, a, _ = two
    reg.activate(a)
    reg.pointer.write_text('{"release_id": ')
    with pytest.raises(RegistryError, match=r"active\.json: not valid JSON"):
        reg.active()


# fsync is slowed (same semantics) so that kills also land between writing the temp file and renaming it
KILL_CHILD = textwrap.dedent("""
    import os, sys, time
    from tileship.release.registry import Registry
    _fsync = os.fsync
    os.fsync = lambda fd: (time.sleep(0.003), _fsync(fd))[1]
    reg, ids = Registry(sys.argv[1]), sys.argv[2:4]
    print("ready", flush=True)
    i = 0
    while True:
        target = ids[i % 2]
        print("begin", target, flush=True)
        reg.activate(target)
        print("done", target, flush=True)
        i += 1
""")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_kill_9_at_random_instants_never_tears_the_pointer(two: tuple[Registry, str, str]) -> None:
    reg, a, b = two
    reg.activate(a)
    rng = random.Random(6)
    mid_activation = mid_write = 0
    iterations = 0
    deadline = time.monotonic() + 60
    while iterations < 40 and time.monotonic() < deadline:
        ids = [a, b] if iterations % 2 else [b, a]
        proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(reg.root), *ids], stdout=subprocess.PIPE,
                                text=True, env=_child_env())
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read().split("\n")[:-1]  # complete lines only: the kill may cut the last one short
        assert proc.wait() == -signal.SIGKILL, "the child must still have been running when killed"
        lines = [parts for ln in rest if len(parts := ln.split()) == 2]
        state = json.loads((reg.root / POINTER).read_text())  # whole JSON, never torn or empty
        assert state["release_id"] in (a, b)
        assert all(h["release_id"] in (a, b) for h in state["history"])
        assert reg.active().release_id == state["release_id"]
        if lines and lines[-1][0] == "done":
            assert state["release_id"] == lines[-1][1], f"iteration {iterations}: the completed activation was lost"
        elif lines and lines[-1][0] == "begin":
            mid_activation += 1
            mid_write += bool(list(reg.root.glob(".active.tmp-*")))
        iterations += 1
    assert iterations >= 30, f"only {iterations} iterations in the time bound"
    assert mid_activation >= 5, (
        f"only {mid_activation} kills landed inside an activation: the test did not exercise the write"
    )
    assert mid_write >= 1, "no kill landed between writing the temp pointer and renaming it"
    reg.activate(a)  # the killed holders' lock was released by the kernel
    assert reg.activate(b).release_id == b
    assert list(reg.root.glob(".active.tmp-*")) == []  # a writer's leftovers are cleaned under the lock


SERIAL_CHILD = textwrap.dedent("""
    import os, sys, time
    from tileship.release.registry import Registry
    reg, go, ids = Registry(sys.argv[1]), sys.argv[2], sys.argv[3:5]
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(10):
        reg.activate(ids[i % 2])
""")


def test_concurrent_activations_are_serialized(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    ids = [reg.publish(fake_release(tmp_path, t)[0]) for t in ("a1", "b1", "a2", "b2", "a3", "b3")]
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SERIAL_CHILD, str(reg.root), str(go), *ids[2 * k:2 * k + 2]],
                              env=_child_env())
             for k in range(3)]
    time.sleep(1.0)  # let them all import and wait
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    # 30 activations, each a change (no two processes share a release): a lost update shortens the history
    assert len(reg.history()) == 29
    assert reg.active().release_id in ids


def test_cli_publish_activate_rollback(tmp_path: Path) -> None:
    from tileship.cli import app

    src_a, a = fake_release(tmp_path, "a")
    src_b, b = fake_release(tmp_path, "b")
    reg = ["--registry", str(tmp_path / "reg")]
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        r = runner.invoke(app, list(args), catch_exceptions=False)
        return r.exit_code, r.output

    assert run("publish", str(src_a), *reg)[0] == 0
    assert run("publish", str(src_b), *reg)[0] == 0
    assert run("activate", a, *reg)[0] == 0
    code, out = run("activate", b, *reg)
    assert code == 0 and f"active: {b}" in out and f"rollback would return to {a}" in out
    code, out = run("releases", *reg)
    assert code == 0 and a in out and b in out and "unverified" in out
    code, out = run("activate", "--reference", *reg)
    assert code == 0 and "reference only" in out
    code, out = run("rollback", *reg)
    assert code == 0 and f"active: {b}" in out and "reference only" not in out
    (tmp_path / "reg" / "releases" / a / "release.json").write_text("{}")
    code, out = run("activate", a, *reg)
    assert code == 1 and "refusing to activate" in out and "release.json" in out
    assert Registry(tmp_path / "reg").active().release_id == b


# -- the rollback drill against a real `tileship serve` subprocess (CPU "c" releases) ----------------

def variant(src: Path, where: Path, **release_changes: object) -> Path:
    """A copy of a release with release.json edited (a different release id)."""
    import shutil

    dest = where / f"variant-{len(list(where.glob('variant-*')))}"
    shutil.copytree(src, dest)
    rel = json.loads((dest / "release.json").read_text())
    rel["model"]["version"] = str(release_changes.pop("version", "2"))
    for op, ref in release_changes.items():
        rel["operators"][op]["reference"] = ref
    (dest / "release.json").write_text(json.dumps(rel, indent=2, sort_keys=True) + "\n")
    bundle.write_manifest(dest)
    return dest


def drill_registry(cpu_release_build: object, tmp_path: Path, old_src: Path) -> tuple[Registry, str, str]:
    reg = Registry(tmp_path / "reg")
    new = reg.publish(cpu_release_build.path)  # type: ignore[attr-defined]
    old = reg.publish(old_src)
    reg.activate(old)
    reg.activate(new)
    return reg, new, old


def test_drill_switches_under_load_without_a_failed_request(cpu_release_build: object, tmp_path: Path) -> None:
    from tileship.verify.drill import DrillOptions, run_drill

    varied = variant(cpu_release_build.path, tmp_path)  # type: ignore[attr-defined]
    reg, new, old = drill_registry(cpu_release_build, tmp_path, varied)
    report = run_drill(DrillOptions(registry=reg.root, out_dir=tmp_path / "report", phase_seconds=1.0, concurrency=2,
                                    per_op=2, startup_timeout_s=300))
    assert report["passed"], (tmp_path / "report" / "drill.txt").read_text()
    assert (
        report["totals"]["requests"] > 20
        and report["totals"]["failed"] == report["totals"]["dropped"] == report["totals"]["mismatched"] == 0
    )
    phases = {w["name"]: w for w in report["windows"] if "expected" in w}
    assert list(phases) == ["N", "N-1", "reference", "N (restored)"]
    assert all(k.startswith(f"{new}:") for k in phases["N"]["served_by"]) and all(
        k.startswith(f"{new}:") for k in phases["N (restored)"]["served_by"]
    )
    assert all(k.startswith(f"{old}:") for k in phases["N-1"]["served_by"])
    assert set(phases["reference"]["served_by"]) == {f"{old}:reference:disabled_by_policy"}
    switches = [w["switch"] for w in report["windows"] if "switch" in w]
    assert [s["result"] for s in switches] == ["swapped"] * 3 and all(s["reload_s"] > 0 for s in switches)
    assert report["compile_attempts"] == 0
    text = (tmp_path / "report" / "drill.txt").read_text()
    assert text.startswith("tileship rollback drill: PASSED") and "switch N -> N-1" in text
    written = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert written == ["drill.json", "drill.txt", "metrics.txt", "server.log"], written  # no temporary left
    assert reg.active() == Active(new, reg.releases_dir / new, False, reg.active().previous, "none")


def test_drill_reports_a_release_that_fails_to_load_and_the_old_one_keeps_serving(
    cpu_release_build: object, tmp_path: Path
) -> None:
    from tileship.verify.drill import DrillOptions, run_drill

    broken = variant(cpu_release_build.path, tmp_path,  # type: ignore[attr-defined]
                     add="tileship.catalog.cpu.no_such_reference")
    reg, new, old = drill_registry(cpu_release_build, tmp_path, broken)
    report = run_drill(DrillOptions(registry=reg.root, out_dir=tmp_path / "report", phase_seconds=1.0, concurrency=2,
                                    per_op=1, ops=("rmsnorm_cpu",), startup_timeout_s=300))
    assert not report["passed"] and not report["switches_ok"]
    t = report["totals"]
    assert t["failed"] == t["dropped"] == t["mismatched"] == 0, "a failed load must not fail requests"
    phase = next(w for w in report["windows"] if w["name"] == "N-1")
    assert phase["stale"] == phase["requests"] > 0 and all(k.startswith(f"{new}:") for k in phase["served_by"])
    first = next(w["switch"] for w in report["windows"] if "switch" in w)
    assert first["status"] == 409 and first["result"] == "failed" and "no_such_reference" in first["error"]
    assert "FAILED" in (tmp_path / "report" / "drill.txt").read_text().splitlines()[0]


def test_a_copy_that_holds_another_release_names_both_ids_and_replace_repairs_it(tmp_path: Path) -> None:
    import shutil

    src_a, a = fake_release(tmp_path, "a")
    src_b, b = fake_release(tmp_path, "b")
    reg = Registry(tmp_path / "reg")
    reg.publish(src_a)
    reg.publish(src_b)
    shutil.rmtree(reg.releases_dir / a)
    shutil.copytree(reg.releases_dir / b, reg.releases_dir / a)  # a's copy now holds b
    with pytest.raises(RegistryError) as info:
        reg.publish(src_a)
    msg = str(info.value)
    assert f"copy of release {a}" in msg and f"holds another release, {b}" in msg and "--replace" in msg, msg
    assert "other evidence" not in msg, msg
    assert reg.publish(src_a, replace=True) == a
    assert reg.publish(src_a) == a  # the copy holds a again: publishing it once more is a no-op
