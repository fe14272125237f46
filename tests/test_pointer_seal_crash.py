"""The real `tileship activate --sign-key` and `tileship rollback --sign-key` killed at every write boundary
(``crashpoints``), from a sealed pointer and from an unsigned one. After each kill: ``active.json`` is the old
pointer or the new one, whole (byte for byte one of the two); a sealed one is accepted by ``pointer_seal.check``
with the activator's public key (an unsigned old one is the old unsigned pointer); and the next signed activate
succeeds with a generation above every pointer written so far, which a reader that served any of them accepts."""

from __future__ import annotations

import shutil
from pathlib import Path

import crashpoints
import pytest
from test_pointer_seal import _keygen
from test_registry import fake_release

from tileship.release import pointer_seal
from tileship.release.registry import Registry, read_pointer


@pytest.mark.parametrize("command,sealed_before,valid_for", [
    ("activate", True, None), ("activate", False, None), ("rollback", True, None), ("rollback", False, None),
    ("activate", True, "7d"), ("rollback", False, "7d")])
def test_a_signed_pointer_change_killed_at_every_write_boundary(tmp_path: Path, command: str, sealed_before: bool,
                                                                valid_for: str | None) -> None:
    """With ``--valid-for`` the new pointer states ``expires`` (signed): it is the old pointer or the new one,
    whole, as without; the new ones of two runs differ only in ``expires`` and ``signature``."""
    key, pub = _keygen(tmp_path, "activator")
    trusted = pointer_seal.trusted([pub])
    seed, root = tmp_path / "seed", tmp_path / "reg"
    reg = Registry(seed, activator_key=key if sealed_before else None)
    a, b, c = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b", "c"))
    reg.activate(a)
    reg.activate(b)  # generation 2, sealed or not; rollback returns to A, activate moves to C
    old = reg.pointer.read_bytes()
    args = [command, *([c] if command == "activate" else []), "--registry", str(root), "--sign-key", str(key),
            *(["--valid-for", valid_for] if valid_for else [])]
    outcomes = {"old": 0, "new": 0}

    def fresh() -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(seed, root)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-800:]
        r = Registry(root, activator_key=key)
        body = r.pointer.read_bytes()
        state = read_pointer(r.pointer)  # whole: a RegistryError here is a torn pointer
        want = {"activate": c, "rollback": a}[command]
        if body == old:
            outcomes["old"] += 1
            served = pointer_seal.check(r.pointer, state, trusted) if sealed_before else None
            assert sealed_before or pointer_seal.sealed_by(state) is None
        else:
            outcomes["new"] += 1
            assert state["release_id"] == want and pointer_seal.generation_of(state) == 3, state
            served = pointer_seal.check(r.pointer, state, trusted)  # a new pointer is always sealed
            assert _but_time(body) == _but_time(new), "not the pointer the completed command writes"
            assert (served.expires is not None) == (valid_for is not None), state
        nxt = r.activate(c if command == "rollback" else a)  # the next signed activate, of another release
        assert nxt.generation is not None and nxt.generation > max(pointer_seal.generation_of(state), 2), o.n
        accepted = pointer_seal.check(r.pointer, read_pointer(r.pointer), trusted, after=served)
        assert accepted.generation == nxt.generation, (o.n, accepted)

    fresh()
    total = crashpoints.boundaries(crashpoints.run(args, 10**6))
    new = (root / "active.json").read_bytes()
    assert total >= 3 and new != old
    runs = list(crashpoints.sweep(args, before=fresh, check=check))
    assert sum(o.killed for o in runs) == total and outcomes["old"] >= 1 and outcomes["new"] >= 1, outcomes


def _but_time(body: bytes) -> dict:
    """A pointer without what depends on the clock: its ``expires`` and the signature over it."""
    import json

    return {k: v for k, v in json.loads(body).items() if k not in ("expires", "signature")}


def test_the_first_bound_pointer_killed_at_every_write_boundary(tmp_path: Path) -> None:
    """A registry as a tileship before registry ids left it (no ``registry.json``, a sealed pointer without
    ``registry_id``), then `tileship activate --sign-key` killed at every write boundary: ``registry.json`` is
    absent or whole; ``active.json`` is the old pointer (which readers trusting the key still accept: it predates
    the id) or the new one bound to that id; the next activate binds to the same id, and a reader that served
    either pointer accepts it."""
    from test_pointer_binding import _legacy

    from tileship.release import registry_id as regid

    key, pub = _keygen(tmp_path, "activator")
    trusted = pointer_seal.trusted([pub])
    seed, root = tmp_path / "seed", tmp_path / "reg"
    reg = Registry(seed, activator_key=key)
    a, b, c = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b", "c"))
    reg.activate(a)
    reg.activate(b)
    (seed / regid.NAME).unlink()
    _legacy(reg, key)
    old = reg.pointer.read_bytes()
    seen = {"no id": 0, "id, old pointer": 0, "new": 0}

    def fresh() -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(seed, root)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-800:]
        r = Registry(root, activator_key=key)
        ident = regid.read(root)  # whole or absent: a RegistryError here is a torn id
        state = read_pointer(r.pointer)
        served = pointer_seal.check(r.pointer, state, trusted)
        if r.pointer.read_bytes() == old:
            seen["no id" if ident is None else "id, old pointer"] += 1
            assert served.registry_id is None and (ident is None or ident.since == 3), ident
        else:
            seen["new"] += 1
            assert ident is not None and state["registry_id"] == ident.registry_id == served.registry_id
            assert state["release_id"] == c and state["generation"] == ident.since == 3, state
        nxt = r.activate(a)
        after = regid.read(root)
        assert after is not None and (ident is None or after == ident), (ident, after)
        accepted = pointer_seal.check(r.pointer, read_pointer(r.pointer), trusted, after=served)
        assert accepted.registry_id == after.registry_id and accepted.generation == nxt.generation, o.n

    args = ["activate", c, "--registry", str(root), "--sign-key", str(key)]
    runs = list(crashpoints.sweep(args, before=fresh, check=check))
    assert runs[-1].killed is False and all(seen.values()), seen
