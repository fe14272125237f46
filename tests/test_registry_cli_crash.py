"""What tests/test_registry_crash.py does not cover: the real `tileship publish` of a `tileship pack`
archive of a real "c" release with ``--image-digest`` (unpack, copy, image record), killed at write
boundaries across the whole run, while another release is active. After each kill the registry's own
reads agree (the pointer names a whole release, the history exists), the new release is listed
whole or not at all, its image record is the digest or absent; the next publish finishes it, and
activating it then leaves no temporary."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import crashpoints

from tileship.release import bundle, integrity
from tileship.release.registry import Registry

_spec = importlib.util.spec_from_file_location(
    "registry_crash_trials", Path(__file__).resolve().parents[1] / "benchmarks" / "registry_crash_trials.py")
assert _spec is not None and _spec.loader is not None
trials = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = trials
_spec.loader.exec_module(trials)
DIGEST = "sha256:" + "ab" * 32


def test_publish_archive_with_image_digest_killed_at_write_boundaries(cpu_release: Path, tmp_path: Path) -> None:
    archive = bundle.pack(cpu_release, tmp_path / "r.tileship.tar.gz")
    rid = integrity.check(cpu_release, trusted_keys=[]).release_id
    root, seed = tmp_path / "reg", tmp_path / "seed"
    reg = Registry(seed)
    other = reg.publish(trials.fake_release(tmp_path, "a"))
    reg.activate(other)
    args = ["publish", str(archive), "--registry", str(root), "--image-digest", DIGEST]
    shutil.copytree(seed, root)
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    states: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(seed, root)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        r = Registry(root)
        assert trials.inconsistency(r) is None, (o.n, trials.inconsistency(r))
        assert r.active().release_id == other
        listed = [i.release_id for i in r.releases()]
        if rid in listed:
            integrity.check(r.path_of(rid), trusted_keys=[])
            states.add("published" + (" with image" if r.image_digest(rid) == DIGEST else ""))
            assert r.image_digest(rid) in (None, DIGEST)
        else:
            states.add("absent")
        assert r.publish(archive, image_digest=DIGEST) == rid  # the next publish finishes it
        assert r.image_digest(rid) == DIGEST
        r.activate(rid)
        assert r.active().release_id == rid and trials.leftovers(r) == [], trials.leftovers(r)

    outcomes = list(crashpoints.sweep(args, before=fresh, check=check, step=max(1, total // 10)))
    assert sum(o.killed for o in outcomes) >= 5 and "absent" in states and "published with image" in states, states
