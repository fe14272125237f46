"""A build's last steps killed at every write boundary: ``outputs.commit`` (manifest, signature,
the rename into ``<release id>``) on a real "c" release, then ``outputs.recover`` as the next build
runs it.

The release under its id is always whole: the old one or the new one, and the new one is signed
when the build was given a key (it used to be renamed in first and signed afterwards, so a kill
between left an unsigned release under its id; and a rebuild of the same id renamed the old release
aside before the new one came in, so a kill between left no release at all). ``recover`` leaves no
staging or trash directory behind and puts back a release moved aside.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import crashpoints
import pytest

from tileship.build import outputs
from tileship.release import bundle, evidence, integrity

_COMMIT = """
import shutil, sys
from pathlib import Path
from tileship.build import outputs
src, out, key, fallback = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
if fallback:
    from tileship.release import swap
    swap.exchange = lambda a, b: False
staging = outputs.staging_dir(out)
shutil.copytree(src, staging, dirs_exist_ok=True)
for name in ("manifest.json", "manifest.sig"):
    (staging / name).unlink(missing_ok=True)
shutil.rmtree(staging / "evidence", ignore_errors=True)
arm()
outputs.commit(staging, out, key)
print("committed")
"""


def _state(out: Path, rid: str, new_pub: Path) -> str:
    """'absent', 'old' (the release with the old evidence) or 'new' (signed by the new key)."""
    final = out / rid
    if not final.exists():
        return "absent"
    integrity.check(final, trusted_keys=[])  # whole: raises on any half-written file
    if (final / evidence.EVIDENCE).exists():
        return "old"
    integrity.check(final, trusted_keys=[new_pub])  # the new release: signed by the build's key
    return "new"


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "rename-aside"])
@pytest.mark.parametrize("existing", [True, False], ids=["rebuild", "first-build"])
def test_commit_killed_at_every_boundary(cpu_release: Path, tmp_path: Path, fallback: bool, existing: bool) -> None:
    out = tmp_path / "builds"
    key = tmp_path / "new.pem"
    new_pub = bundle.generate_key(key)
    rid = integrity.check(cpu_release, trusted_keys=[]).release_id
    evidence.write(cpu_release, {"schema": 1, "old": True})  # marks the old release; not part of the id
    states: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        if existing:
            shutil.copytree(cpu_release, out / rid)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or (o.returncode == 0 and "committed" in o.output), o.output
        state = _state(out, rid, new_pub)
        if state == "absent":  # only before anything was renamed in, or aside with the old release whole
            aside = [p for p in out.iterdir() if p.name.startswith(outputs.TRASH)]
            assert not existing or (fallback and aside and integrity.check(aside[0], trusted_keys=[])), \
                f"boundary {o.n}: the old release is gone"
        states.add(state)
        done = outputs.recover(out)  # what the next build does first
        after = _state(out, rid, new_pub)
        assert after == state or (state == "absent" and existing and after == "old"), (o.n, state, after, done)
        assert sorted(p.name for p in out.iterdir()) in ([".lock"], [".lock", rid]), (o.n, list(out.iterdir()))

    outcomes = list(crashpoints.sweep([str(cpu_release), str(out), str(key), "1" if fallback else "0"],
                                      before=fresh, check=check, code=_COMMIT))
    assert sum(o.killed for o in outcomes) >= 5
    assert "new" in states and ("old" if existing else "absent") in states, states
    if existing and not fallback:
        assert "absent" not in states, "the exchange must never leave the id without a release"

