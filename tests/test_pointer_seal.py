"""The signed activation pointer (``release.pointer_seal``): ``activate``/``rollback`` seal ``active.json`` with
an activator key and move its generation up; a reader that trusts activator keys (``tileship serve REGISTRY
--trusted-activator-key``) refuses a pointer that is unsigned, sealed by another key, changed after sealing or
older than the one it serves: at start with exit 1, at reload with 409 while the old release keeps serving.
Without trusted activator keys nothing changes. Real keys (``tileship keygen``), real registries in tmp_path,
a real server on 127.0.0.1 for the reload."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_registry import SRC, fake_release
from test_serve import copy_release, post, serving
from test_serve_warm_rollback import served_by
from typer.testing import CliRunner

from tileship.cli import app
from tileship.errors import PointerSignatureError, RegistryError
from tileship.release import bundle, pointer_seal
from tileship.release.registry import POINTER, Active, Registry, read_pointer
from tileship.serve import ServeConfig
from tileship.serve.source import resolve, rollback_target


def _keygen(where: Path, name: str) -> tuple[Path, Path]:
    """(private, public) written by the real `tileship keygen`."""
    res = CliRunner().invoke(app, ["keygen", str(where / name)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return where / name, where / f"{name}.pub"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("activator-keys")
    return {name: _keygen(d, name) for name in ("activator", "other")}


def _kid(pub: Path) -> str:
    return bundle.key_id(bundle.load_public_key(pub))


def _trust(*pubs: Path) -> list[Any]:
    return pointer_seal.trusted(list(pubs))


@pytest.fixture
def signed(tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> tuple[Registry, str, str]:
    """A registry where A, then B were activated, sealed by the activator key (generations 1, 2)."""
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    a, b = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b"))
    reg.activate(a)
    reg.activate(b)
    return reg, a, b


def _edit(reg: Registry, **fields: Any) -> None:
    state = json.loads(reg.pointer.read_text())
    state.update(fields)
    reg.pointer.write_text(json.dumps(state))


def test_a_signed_activation_is_accepted_and_names_its_key_and_generation(signed, keys) -> None:
    reg, a, b = signed
    kid = _kid(keys["activator"][1])
    active = reg.active()
    assert (active.release_id, active.generation, active.sealed_by) == (b, 2, kid)
    assert active == Active(b, reg.releases_dir / b, False, a, "none")  # generation and seal: not part of the state
    target = resolve(reg.root, activator_keys=_trust(keys["other"][1], keys["activator"][1]))
    assert target.path == reg.releases_dir / b
    assert target.sealed is not None and (target.sealed.generation, target.sealed.key_id) == (2, kid)
    raw = json.loads(reg.pointer.read_text())
    assert raw["sealed_by"] == kid and raw["generation"] == 2 and "generation" not in raw["history"][0]


@pytest.mark.parametrize("change", [
    pytest.param({"release_id": "A"}, id="release_id"),
    pytest.param({"reference_only": True}, id="reference_only"),
    pytest.param({"evidence": "sha256:" + "0" * 64}, id="evidence-pin"),
    pytest.param({"history": []}, id="history"),
    pytest.param({"generation": 99}, id="generation"),
    pytest.param({"signature": "AAAA"}, id="signature"),
    pytest.param({"extra": 1}, id="added-field"),
])
def test_a_pointer_changed_after_sealing_is_refused(signed, keys, change: dict[str, Any]) -> None:
    reg, a, _ = signed
    if change.get("release_id") == "A":
        change = {"release_id": a}  # points at the other, published release: a valid pointer but for its seal
    _edit(reg, **change)
    with pytest.raises(PointerSignatureError) as exc:
        resolve(reg.root, activator_keys=_trust(keys["activator"][1]))
    assert "does not verify" in exc.value.message and "changed after it was sealed" in exc.value.message
    assert str(reg.pointer) in exc.value.message and exc.value.key_id == _kid(keys["activator"][1])
    assert exc.value.path == str(reg.pointer)


def test_a_seal_claiming_another_trusted_key_is_refused(signed, keys) -> None:
    reg, _, _ = signed
    _edit(reg, sealed_by=_kid(keys["other"][1]))  # both trusted: the signature is the activator's, not other's
    with pytest.raises(PointerSignatureError, match="does not verify"):
        resolve(reg.root, activator_keys=_trust(keys["activator"][1], keys["other"][1]))


def test_a_pointer_sealed_by_an_untrusted_key_is_refused(signed, keys) -> None:
    reg, _, _ = signed
    with pytest.raises(PointerSignatureError) as exc:
        resolve(reg.root, activator_keys=_trust(keys["other"][1]))
    kid = _kid(keys["activator"][1])
    assert f"sealed by activator key {kid}, which is not trusted" in exc.value.message
    assert exc.value.key_id == kid and _kid(keys["other"][1]) in exc.value.message


def test_an_unsigned_pointer_is_refused_when_activator_keys_are_trusted(tmp_path, keys) -> None:
    reg = Registry(tmp_path / "reg")  # no activator key (none in the environment either)
    a = reg.publish(fake_release(tmp_path, "a")[0])
    active = reg.activate(a)
    assert (active.generation, active.sealed_by) == (1, None)
    with pytest.raises(PointerSignatureError, match="the pointer is not signed") as exc:
        resolve(reg.root, activator_keys=_trust(keys["activator"][1]))
    assert exc.value.key_id is None
    # what an older tileship writes over a sealed pointer: the same state without the seal
    sealed = Registry(reg.root, activator_key=keys["activator"][0])
    sealed.activate(a)
    state = {k: v for k, v in json.loads(reg.pointer.read_text()).items() if k not in pointer_seal.FIELDS}
    reg.pointer.write_text(json.dumps(state))
    with pytest.raises(PointerSignatureError, match="not signed"):
        resolve(reg.root, activator_keys=_trust(keys["activator"][1]))


def test_a_replayed_older_pointer_is_refused(signed, keys) -> None:
    reg, a, b = signed
    trust = _trust(keys["activator"][1])
    gen2 = reg.pointer.read_bytes()
    serving_now = resolve(reg.root, activator_keys=trust).sealed
    reg.rollback()  # generation 3 names A
    gen3 = resolve(reg.root, activator_keys=trust, after=serving_now)
    assert gen3.path == reg.releases_dir / a and gen3.sealed is not None and gen3.sealed.generation == 3
    reg.pointer.write_bytes(gen2)  # validly sealed, but older than what serves
    with pytest.raises(PointerSignatureError) as exc:
        resolve(reg.root, activator_keys=trust, after=gen3.sealed)
    assert "generation 2 is older than generation 3" in exc.value.message and "replay" in exc.value.message
    # without a pointer served yet (a fresh server) it is accepted: trust on first use of the generation
    assert resolve(reg.root, activator_keys=trust).path == reg.releases_dir / b
    # the activator's next pointer is newer than any it wrote, not than the one put back (2): servers take it
    assert reg.rollback().generation == 4
    assert resolve(reg.root, activator_keys=trust, after=gen3.sealed).path == reg.releases_dir / a


def test_another_pointer_of_the_same_generation_is_refused(tmp_path, keys) -> None:
    """A registry and a copy of it (one registry id) sealed by one key, changed apart: one's pointer put into the
    other, at the same generation. (Between two registries the binding refuses it first: test_pointer_binding.)"""
    reg = Registry(tmp_path / "reg1", activator_key=keys["activator"][0])
    a, b = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b"))
    reg.activate(a)
    copy = Registry(shutil.copytree(reg.root, tmp_path / "reg2"), activator_key=keys["activator"][0])
    reg.activate_reference()
    copy.activate(b)
    trust = _trust(keys["activator"][1])
    first = resolve(reg.root, activator_keys=trust)
    reg.pointer.write_bytes(copy.pointer.read_bytes())
    with pytest.raises(PointerSignatureError, match="another pointer of the same generation as generation 2"):
        resolve(reg.root, activator_keys=trust, after=first.sealed)


def test_rollback_and_reference_are_sealed_through_the_cli(tmp_path, keys, monkeypatch) -> None:
    src_a, a = fake_release(tmp_path, "a")
    src_b, b = fake_release(tmp_path, "b")
    reg = ["--registry", str(tmp_path / "reg")]
    kid = _kid(keys["activator"][1])

    def run(*args: str) -> str:
        r = CliRunner().invoke(app, [*args, *reg], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())

    run("publish", str(src_a))
    run("publish", str(src_b))
    assert "pointer generation 1: not signed" in run("activate", a)
    out = run("activate", a, "--sign-key", str(keys["activator"][0]))  # the same state: sealed anew
    assert f"pointer generation 2: sealed by activator key {kid}" in out
    monkeypatch.setenv("TILESHIP_ACTIVATOR_KEY", str(keys["activator"][0]))
    assert f"generation 3: sealed by activator key {kid}" in run("activate", b)
    monkeypatch.delenv("TILESHIP_ACTIVATOR_KEY")
    out = run("rollback", "--sign-key", str(keys["activator"][0]))
    assert f"active: {a}" in out and f"generation 4: sealed by activator key {kid}" in out
    target = resolve(tmp_path / "reg", activator_keys=_trust(keys["activator"][1]))
    assert target.path.name == a and target.sealed is not None and target.sealed.generation == 4
    assert "generation 5: not signed" in run("activate", "--reference")  # no key: an unsigned pointer
    with pytest.raises(PointerSignatureError, match="not signed"):
        resolve(tmp_path / "reg", activator_keys=_trust(keys["activator"][1]))
    r = CliRunner().invoke(app, ["rollback", "--sign-key", str(keys["activator"][1]), *reg])  # a public key
    assert r.exit_code == 1 and "not a PEM private key" in " ".join(r.output.split())
    assert read_pointer(tmp_path / "reg" / POINTER)["generation"] == 5  # refused before anything was written


def test_without_trusted_activator_keys_nothing_is_checked(signed, tmp_path) -> None:
    reg, a, b = signed
    _edit(reg, release_id=a)  # a changed sealed pointer: not checked without keys, as before
    assert resolve(reg.root).path == reg.releases_dir / a
    assert resolve(reg.root, activator_keys=pointer_seal.trusted(None)).path == reg.releases_dir / a  # env unset
    old = Registry(tmp_path / "old")  # a pointer from before generations and seals
    c = old.publish(fake_release(tmp_path, "c")[0])
    old.pointer.write_text(json.dumps({"schema": 1, "release_id": c, "reference_only": False, "history": []}))
    assert old.active() == Active(c, old.releases_dir / c, False, None, None)
    assert (old.active().generation, old.active().sealed_by) == (None, None)
    assert old.activate(c, reference_only=True).generation == 1  # the next write counts from 0


def test_an_older_reader_reads_a_sealed_pointer(signed) -> None:
    """Schema 1 still: what an older tileship's reader checks of the pointer holds for a sealed one."""
    reg, a, b = signed
    data = json.loads(reg.pointer.read_text())
    assert data["schema"] == 1 and data["release_id"] == b and data["history"][0]["release_id"] == a
    assert set(data) - {"schema", "release_id", "reference_only", "evidence", "history"} == set(pointer_seal.FIELDS)


def test_the_warm_rollback_standby_is_not_taken_from_an_unsealed_pointer(signed, keys) -> None:
    reg, a, _ = signed
    trust = _trust(keys["activator"][1])
    target = rollback_target(reg.root, activator_keys=trust)
    assert target is not None and target.path == reg.releases_dir / a
    _edit(reg, history=[{"release_id": a, "reference_only": True}])
    with pytest.raises(PointerSignatureError):
        rollback_target(reg.root, activator_keys=trust)


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tileship serve ...` in a child process (a server that starts anyway is a timeout, not a hung test)."""
    environ = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    return subprocess.run([sys.executable, "-m", "tileship.cli", "serve", "--port", "0", *args], env=environ,
                          capture_output=True, text=True, timeout=60)


def test_serve_refuses_to_start_on_a_pointer_its_activator_keys_refuse(tmp_path, keys) -> None:
    reg = Registry(tmp_path / "reg")
    reg.activate(reg.publish(fake_release(tmp_path, "a")[0]))  # unsigned
    res = _serve(str(reg.root), "--trusted-activator-key", str(keys["activator"][1]))
    err = " ".join(res.stderr.split())
    assert res.returncode == 1, err
    assert f"{reg.pointer}: the pointer is not signed, but activator keys are trusted" in err
    Registry(reg.root, activator_key=keys["activator"][0]).activate(str(reg.active().release_id))  # sealed now
    res = _serve(str(reg.root), env={"TILESHIP_TRUSTED_ACTIVATOR_KEYS": str(keys["other"][1])})
    assert res.returncode == 1 and "which is not trusted" in " ".join(res.stderr.split()), res.stderr


def test_a_reload_refuses_a_replayed_tampered_or_unsigned_pointer_and_keeps_serving(
        cpu_release_build, tmp_path, keys) -> None:
    b_src = copy_release(cpu_release_build.path, tmp_path / "b", version="sealed-2")
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    id_a, id_b = reg.publish(cpu_release_build.path), reg.publish(b_src)
    reg.activate(id_a)
    gen1 = reg.pointer.read_bytes()
    reg.activate(id_b)
    config = ServeConfig(source=reg.root, trusted_activator_keys=(keys["activator"][1],), warm_rollback=False,
                         log_stream=io.StringIO())
    with serving(config) as srv:
        assert served_by(srv) == id_b

        def refused(words: str, serving: str = id_b) -> None:
            r = post(srv, "/v2/repository/reload")
            assert r.status_code == 409, r.text
            body = r.json()
            assert body["stage"] == "resolve" and words in body["error"] and str(reg.pointer) in body["error"]
            assert body["serving"] == serving and served_by(srv) == serving
            ready = httpx.get(srv.url + "/v2/health/ready", timeout=30).json()
            assert ready["ready"] is True and words in ready["last_failure"]["error"]

        reg.pointer.write_bytes(gen1)  # the older pointer, validly sealed, put back
        refused("generation 1 is older than generation 2")
        _edit(reg, generation=7)
        refused("does not verify")
        Registry(reg.root).activate_reference()  # written without the activator key (generation 8)
        refused("not signed")
        reg.activate(id_a)  # sealed, generation 9: accepted
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
        assert served_by(srv) == id_a and srv.service.holder.pointer.generation == 9
        reg.pointer.write_bytes(gen1)  # the pointer naming the release now serving, but older: still refused
        refused("generation 1 is older than generation 9", serving=id_a)
        reg.activate(id_b)
        gen10 = reg.pointer.read_bytes()
        reg.activate(id_a)  # generation 11: the state serving, so the reload finds it unchanged...
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "unchanged", r.text
        reg.pointer.write_bytes(gen10)  # ...and a pointer older than 11 is refused, though newer than 9
        refused("generation 10 is older than generation 11", serving=id_a)


def test_registry_errors_stay_registry_errors_with_keys(tmp_path, keys) -> None:
    """An empty registry names nothing: trusted keys do not turn 'no active release' into a seal error."""
    (tmp_path / "reg").mkdir()
    with pytest.raises(RegistryError, match="has no active release"):
        resolve(tmp_path / "reg", activator_keys=_trust(keys["activator"][1]))
