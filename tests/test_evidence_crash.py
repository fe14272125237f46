"""``evidence.write`` (how `tileship verify` and `tileship tune` end) with a verifier key, on a signed
real "c" release, killed at every write boundary (tests/test_integrity.py stops it at two).

After each kill the release checks and loads (``tileship.load``) with the old evidence or the new,
its evidence seal vouches for the evidence in effect (or, between the evidence's move and its seal's,
the evidence is not trusted), and its manifest signature is valid (the old
state) or absent (the write drops it by contract): never a stale signature over the new manifest,
which a server trusting the build key would report as a failed signature check, as if tampered
(the signature used to be removed only after the manifest moved). The next write and sign finish
it without temporaries. A kill between the evidence's move and its seal's used to leave files that
matched neither manifest: the release refused as tampered for good."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import crashpoints

import tileship
from tileship.errors import SignatureError
from tileship.release import bundle, evidence, evidence_seal, integrity

_WRITE = """
import sys
from pathlib import Path
from tileship.release import evidence, integrity
root, key = Path(sys.argv[1]), Path(sys.argv[2])
RID = integrity.check(root, trusted_keys=[]).release_id
arm()
evidence.write(root, {"schema": 1, "release_id": RID, "specializations": {}, "tag": "new"}, verifier_key=key)
"""


def test_evidence_write_killed_at_every_boundary(cpu_release: Path, tmp_path: Path) -> None:
    RID = integrity.check(cpu_release, trusted_keys=[]).release_id  # noqa: N806
    build_pub, verifier_pub = bundle.generate_key(tmp_path / "build.pem"), bundle.generate_key(tmp_path / "v.pem")
    evidence.write(cpu_release, {"schema": 1, "release_id": RID, "specializations": {}, "tag": "old"},
                   verifier_key=tmp_path / "v.pem")
    bundle.sign(cpu_release, tmp_path / "build.pem")
    saved = tmp_path / "saved"
    shutil.copytree(cpu_release, saved)
    seen: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(cpu_release)
        shutil.copytree(saved, cpu_release)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output
        integrity.check(cpu_release, trusted_keys=[])  # whole: old or new (a pending manifest counts)
        tag = json.loads((cpu_release / evidence.EVIDENCE).read_text())["tag"]
        seal = evidence_seal.check_dir(cpu_release, [verifier_pub])
        # the seal vouches for the evidence in effect, or (new evidence moved, its seal not yet) it is not trusted
        assert seal.state == evidence_seal.VERIFIED or (tag == "new" and seal.state == evidence_seal.IGNORED), \
            (o.n, tag, seal)
        seen.add(f"{tag} {seal.state}")
        try:
            integrity.check(cpu_release, trusted_keys=[build_pub])
            seen.add(f"{tag} signed")
        except SignatureError as exc:
            assert "not signed" in str(exc), f"boundary {o.n} ({tag}): {exc}"
            seen.add(f"{tag} unsigned")
        assert tileship.load(cpu_release).ops, "the release must load"
        evidence.write(cpu_release, {"schema": 1, "release_id": RID, "specializations": {}, "tag": "next"},
                       verifier_key=tmp_path / "v.pem")  # the next writer finishes what was left
        bundle.sign(cpu_release, tmp_path / "build.pem")
        integrity.check(cpu_release, trusted_keys=[build_pub])
        assert not list(cpu_release.rglob("*.tmp*")), "a temporary was left"

    outcomes = list(crashpoints.sweep([str(cpu_release), str(tmp_path / "v.pem")], before=fresh, check=check,
                                      code=_WRITE))
    assert sum(o.killed for o in outcomes) >= 5 and {"old signed", "new unsigned", "old verified",
                                                                   "new verified"} <= seen, seen
