"""`tileship keygen` killed at every write boundary: no key, a whole private key, or a whole pair;
never a truncated key or a private key beside another key's public half; and it never overwrites
an existing key (it used to truncate the private key in place and rewrite both)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import crashpoints
from cryptography.hazmat.primitives import serialization

from tileship.release import bundle


def _pub_of_private(path: Path) -> bytes:
    return bundle.load_private_key(path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _keygen(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tileship.cli", "keygen", str(path)], capture_output=True, text=True)


def test_keygen_killed_at_every_write_boundary(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key, pub = keys / "k.pem", keys / "k.pem.pub"
    states: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(keys, ignore_errors=True)
        keys.mkdir()

    def check(out: crashpoints.Outcome) -> None:
        assert out.killed or out.returncode == 0, out.output
        if not key.exists():
            assert not pub.exists(), f"boundary {out.n}: a public key without its private key"
            state = "none"
        else:
            expected = _pub_of_private(key)  # raises on a truncated or garbled private key
            assert not pub.exists() or pub.read_bytes() == expected, f"boundary {out.n}: a mismatched pair"
            state = "pair" if pub.exists() else "private only"
            assert key.stat().st_mode & 0o077 == 0, "the private key is readable by others"
        states.add(state)
        r = _keygen(key)  # the next keygen: writes a pair, finishes one, or refuses to overwrite one
        said = r.stdout + r.stderr
        assert "Traceback" not in said, said
        want = {"none": (0, "wrote"), "private only": (0, "completed"), "pair": (1, "already exists")}[state]
        assert r.returncode == want[0] and want[1] in said, (out.n, state, said)
        assert pub.read_bytes() == _pub_of_private(key)
        assert sorted(p.name for p in keys.iterdir()) == ["k.pem", "k.pem.pub"], "a temporary was left"

    outcomes = list(crashpoints.sweep(["keygen", str(key)], before=fresh, check=check))
    assert sum(o.killed for o in outcomes) >= 4, "the sweep must kill keygen inside its writes"
    assert {"none", "private only", "pair"} <= states, states


def test_keygen_never_overwrites_a_key(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    pub = bundle.generate_key(key)
    before = (key.read_bytes(), pub.read_bytes())
    r = _keygen(key)
    assert r.returncode == 1 and "already exists" in r.stdout + r.stderr, r.stdout + r.stderr
    assert (key.read_bytes(), pub.read_bytes()) == before
    pub.unlink()  # a pair whose public half was lost: completed from the private key, which is kept
    r = _keygen(key)
    assert r.returncode == 0 and "completed" in r.stdout, r.stdout + r.stderr
    assert key.read_bytes() == before[0] and pub.read_bytes() == before[1]


def test_keygen_refuses_a_symlink_naming_it(tmp_path: Path) -> None:
    """Unlike the files ``atomic_file`` writes through a symlink, a private key is never written through one (its
    target could be anywhere, readable by whoever owns that folder). A dangling link was refused with "a key
    already exists there", which sent the user looking for a key that does not exist; the error now says it is a
    symlink, and nothing is written at either end."""
    target = tmp_path / "elsewhere" / "k.pem"
    target.parent.mkdir()
    for name, pointing in (("dangling.pem", target), ("pub-link.pem", None)):
        key = tmp_path / name
        if pointing is not None:
            key.symlink_to(pointing)
        else:
            (tmp_path / "pub-link.pem.pub").symlink_to(target.with_name("k.pem.pub"))
        r = _keygen(key)
        assert r.returncode == 1 and "symlink" in r.stdout + r.stderr, r.stdout + r.stderr
        assert "already exists" not in r.stdout + r.stderr
    assert list(target.parent.iterdir()) == [] and not (tmp_path / "pub-link.pem").exists()
