"""Concurrent in-place writers of one release: ``evidence.write`` (what `tileship verify` and `tileship
tune` end with) and `tileship sign`, in separate processes at once, on a real "c" release.

Without a lock they interleave their renames: the evidence of one writer under the manifest of the
other, so the release is refused as tampered for good, and a writer dies on a temporary another one
renamed away (a traceback). With ``inplace.writing`` they take turns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tileship.errors import SignatureError
from tileship.release import bundle, evidence, integrity

WRITES = 60
_EVIDENCE = """
import sys
from pathlib import Path
from tileship.release import evidence
root, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    evidence.write(root, {"schema": 1, "who": who, "i": i, "pad": who * (i * 37 % 3000)})
print("done", who)
"""
_SIGN = """
import sys
from pathlib import Path
from tileship.release import bundle
root, key, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    bundle.sign(root, key)
print("done sign")
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "Traceback" not in out and out.startswith("done"), out


def test_two_evidence_writers_at_once_leave_an_intact_release(cpu_release: Path) -> None:
    procs = [_start(_EVIDENCE, str(cpu_release), who, str(WRITES)) for who in ("A", "B")]
    _finish(procs)
    checked = integrity.check(cpu_release, trusted_keys=[])  # raises on a mixed write
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert ev["who"] in ("A", "B") and ev["i"] == WRITES - 1
    assert json.loads(checked.manifest_bytes)["files"]["evidence/verification.json"]
    assert not [p for p in cpu_release.rglob("*.tmp*")], "a writer left a temporary"


def test_sign_while_evidence_is_written_never_leaves_a_wrong_signature(cpu_release: Path, tmp_path: Path) -> None:
    """The end state is signed by the key (sign was last) or unsigned (an evidence write was last,
    which drops the signature by contract): never a signature over another manifest."""
    pub = bundle.generate_key(tmp_path / "k.pem")
    procs = [_start(_EVIDENCE, str(cpu_release), "A", str(WRITES)),
             _start(_SIGN, str(cpu_release), str(tmp_path / "k.pem"), str(WRITES))]
    _finish(procs)
    integrity.check(cpu_release, trusted_keys=[])
    try:
        integrity.check(cpu_release, trusted_keys=[pub])
    except SignatureError as exc:
        assert "not signed" in str(exc), exc
    bundle.sign(cpu_release, tmp_path / "k.pem")  # and it can be signed again afterwards
    integrity.check(cpu_release, trusted_keys=[pub])


def test_a_writer_held_too_long_is_named(cpu_release: Path) -> None:
    from tileship.release import inplace

    with inplace.writing(cpu_release):
        code = ("import sys; from pathlib import Path; from tileship.release import inplace\n"
                "from tileship.errors import BundleError\n"
                "try:\n    with inplace.writing(Path(sys.argv[1]), timeout_s=0.5): pass\n"
                "except BundleError as e:\n    sys.exit(str(e))\n")
        r = subprocess.run([sys.executable, "-c", code, str(cpu_release)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode != 0 and "another writer" in r.stderr and "Traceback" not in r.stderr, r.stderr
