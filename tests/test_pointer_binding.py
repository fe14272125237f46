"""A signed pointer is bound to its registry (``release.registry_id``, ``pointer_seal``): two registries sealed by
one activator key cannot be given each other's pointers. Registry A's pointer, validly sealed and of a higher
generation, copied into registry B is refused by ``tileship serve`` at start (exit 1) and on reload (409, the
release serving keeps serving), by ``tileship diagnose`` and ``tileship releases``, and by the Ray controller;
pointers from before registry ids follow the rules of ``pointer_seal``'s docstring. Real keys, real registries."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_pointer_seal import _edit, _serve, _trust, keys  # noqa: F401 (fixture)
from test_pointer_seal_readers import _cli, _controller, _events, _started
from test_registry import fake_release
from test_serve import copy_release, post, serving
from test_serve_warm_rollback import served_by

from tileship.errors import PointerSignatureError, RegistryError
from tileship.release import pointer_seal, pointer_served
from tileship.release import registry_id as regid
from tileship.release.registry import Registry, read_pointer
from tileship.serve import ServeConfig
from tileship.serve.fleet_plan import release_of
from tileship.serve.source import resolve


def _ident(reg: Registry) -> str:
    ident = regid.read(reg.root)
    assert ident is not None
    return ident.registry_id


@pytest.fixture
def two(tmp_path: Path, keys) -> tuple[Registry, Registry, str, str]:  # noqa: F811
    """Registries A (generation 3) and B (generation 1), one activator key, the same two releases published."""
    srcs = [fake_release(tmp_path, t)[0] for t in ("a", "b")]
    regs = [Registry(tmp_path / name, activator_key=keys["activator"][0]) for name in ("A", "B")]
    for reg in regs:
        x, y = (reg.publish(s) for s in srcs)
    regs[0].activate(x)
    regs[0].activate(y)
    regs[0].rollback()
    regs[1].activate(y)
    return regs[0], regs[1], x, y


def _swap(a: Registry, b: Registry) -> None:
    """A's pointer put into B, byte for byte."""
    b.pointer.write_bytes(a.pointer.read_bytes())


def test_each_registry_gets_an_id_once_and_its_pointers_carry_it(tmp_path, keys) -> None:  # noqa: F811
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    x = reg.publish(fake_release(tmp_path, "a")[0])
    assert regid.read(reg.root) is None, "publishing alone writes no id"
    reg.activate(x)
    first = regid.read(reg.root)
    assert first is not None and first.since == 1 and len(first.registry_id) == 32
    reg.activate_reference()
    reg.rollback()
    assert regid.read(reg.root) == first and read_pointer(reg.pointer)["registry_id"] == first.registry_id
    assert [p.name for p in reg.root.iterdir() if ".tmp" in p.name] == []
    other = Registry(tmp_path / "other", activator_key=keys["activator"][0])
    other.activate(other.publish(fake_release(tmp_path / "o", "a")[0]))
    assert _ident(other) != first.registry_id
    sealed = resolve(reg.root, activator_keys=_trust(keys["activator"][1])).sealed
    assert sealed is not None and sealed.registry_id == first.registry_id


def test_a_pointer_copied_from_another_registry_is_refused_naming_both_ids(two, keys) -> None:  # noqa: F811
    a, b, x, y = two
    trust = _trust(keys["activator"][1])
    serving_b = resolve(b.root, activator_keys=trust).sealed
    _swap(a, b)  # validly sealed by the trusted key, generation 3 > 1
    for after in (None, serving_b):
        with pytest.raises(PointerSignatureError) as exc:
            resolve(b.root, activator_keys=trust, after=after)
        msg = exc.value.message
        assert f"the pointer is bound to registry {_ident(a)}, but this registry is {_ident(b)}" in msg, msg
        assert str(b.pointer) in msg and exc.value.path == str(b.pointer)
    assert resolve(b.root).path == b.releases_dir / x, "without trusted keys nothing is checked, as before"
    b.activate(y)  # the activator's next pointer is B's own again, and newer: accepted
    nxt = resolve(b.root, activator_keys=trust, after=serving_b)
    assert nxt.sealed is not None and nxt.sealed.registry_id == _ident(b) and nxt.sealed.generation == 4


def test_replacing_the_registry_id_too_is_refused_by_a_reader_that_served_a_pointer(two, keys, tmp_path) -> None:  # noqa: F811,E501
    a, b, x, y = two
    trust = _trust(keys["activator"][1])
    serving_b = resolve(b.root, activator_keys=trust).sealed
    shutil.copy(a.root / regid.NAME, b.root / regid.NAME)
    _swap(a, b)
    with pytest.raises(PointerSignatureError, match=f"bound to registry {_ident(a)}, but the pointer this server "
                                                    f"serves is bound to registry {serving_b.registry_id}"):
        resolve(b.root, activator_keys=trust, after=serving_b)
    state = tmp_path / "served.json"  # and so does a restarted one that kept it (--generation-state)
    pointer_served.write_served(state, serving_b)
    assert pointer_served.read_served(state) == serving_b
    with pytest.raises(PointerSignatureError, match="the registry's identity changed"):
        resolve(b.root, activator_keys=trust, after=pointer_served.read_served(state))
    record = json.loads(state.read_text())
    del record["registry_id"]  # a record from before registry ids: no id to hold the registry to
    state.write_text(json.dumps(record))
    assert pointer_served.read_served(state) == pointer_seal.Sealed(1, serving_b.key_id, serving_b.digest)
    state.write_text(json.dumps({**record, "registry_id": "../x"}))
    with pytest.raises(PointerSignatureError, match="not a served-pointer record"):
        pointer_served.read_served(state)


def _legacy(reg: Registry, key: Path) -> None:
    """Reseal ``reg``'s pointer as a tileship before registry ids sealed it: no ``registry_id``."""
    from tileship.release import bundle
    from tileship.release.records import write_pointer

    state = read_pointer(reg.pointer)
    old = {k: v for k, v in state.items() if k not in pointer_seal.FIELDS}
    write_pointer(reg.pointer, pointer_seal.seal(old, pointer_seal.generation_of(state), bundle.load_private_key(key)))


def test_pointers_from_before_registry_ids(two, keys) -> None:  # noqa: F811
    a, b, x, y = two
    trust, key = _trust(keys["activator"][1]), keys["activator"][0]
    (b.root / regid.NAME).unlink()  # B as a tileship before registry ids left it
    _legacy(b, key)
    legacy = resolve(b.root, activator_keys=trust)  # no id, an unbound pointer: accepted, as before
    assert legacy.path == b.releases_dir / y and legacy.sealed is not None and legacy.sealed.registry_id is None
    _swap(a, b)  # a bound pointer where the registry has no id: refused
    with pytest.raises(PointerSignatureError, match=f"bound to registry {_ident(a)}, but this registry is not bound"):
        resolve(b.root, activator_keys=trust)
    _legacy(b, key)
    b.activate(y)  # the first write of this version: the id (since generation 4), the pointer bound to it
    assert regid.read(b.root) == regid.Identity(_ident(b), 4) and read_pointer(b.pointer)["generation"] == 4
    bound = resolve(b.root, activator_keys=trust, after=legacy.sealed).sealed
    assert bound is not None and bound.registry_id == _ident(b)
    _legacy(b, key)  # an unbound pointer at generation 4, as an older tileship seals one after the id: refused
    with pytest.raises(PointerSignatureError) as exc:
        resolve(b.root, activator_keys=trust)
    assert f"bound to no registry, but this registry is {_ident(b)}, which binds every pointer from generation 4 " \
           "on (this one is generation 4)" in exc.value.message
    b.activate(y)  # the same state again, with the key: sealed anew, bound
    assert read_pointer(b.pointer)["registry_id"] == _ident(b) and read_pointer(b.pointer)["generation"] == 5
    b.rollback()
    (b.root / regid.NAME).write_text(json.dumps({"registry_id": _ident(b), "since_generation": 99}))
    _legacy(b, key)  # below since_generation: it predates the id (a writer killed between the two): accepted
    assert resolve(b.root, activator_keys=trust).sealed.registry_id is None
    with pytest.raises(PointerSignatureError, match="bound to registry none, but the pointer this server serves"):
        resolve(b.root, activator_keys=trust, after=bound)  # but not by a reader that served a bound one


@pytest.mark.parametrize("body", [b"", b"{}", b"garbage", b'{"registry_id": "../a", "since_generation": 1}',
                                  b'{"registry_id": "' + b"a" * 32 + b'", "since_generation": -1}'])
def test_a_registry_id_file_that_is_not_one_is_refused_never_replaced(two, keys, body: bytes) -> None:  # noqa: F811
    a, b, x, y = two
    (b.root / regid.NAME).write_bytes(body)
    with pytest.raises(PointerSignatureError, match=f"{b.root / regid.NAME}: "):
        resolve(b.root, activator_keys=_trust(keys["activator"][1]))
    with pytest.raises(RegistryError, match=f"{b.root / regid.NAME}: "):
        b.activate(x)
    assert (b.root / regid.NAME).read_bytes() == body and read_pointer(b.pointer)["release_id"] == y


def test_a_pointer_registry_id_of_the_wrong_shape_is_refused_naming_it(two) -> None:
    a, b, x, y = two
    _edit(b, registry_id="../../a")
    with pytest.raises(RegistryError, match="registry_id is not a registry id"):
        b.active()


def test_concurrent_first_writers_share_the_first_id(tmp_path, monkeypatch) -> None:
    """A writer that found no id, while another wrote one meanwhile, takes that one: the link never replaces."""
    root = tmp_path / "reg"
    root.mkdir()
    theirs = regid.ensure(root, since=1)
    real, calls = regid.read, []

    def late(where: Path, *args: Any) -> regid.Identity | None:
        calls.append(where)
        return None if len(calls) == 1 else real(where, *args)  # the first look saw no id yet

    monkeypatch.setattr(regid, "read", late)
    assert regid.ensure(root, since=7) == theirs and len(calls) == 2
    assert sorted(p.name for p in root.iterdir()) == [regid.NAME]


def test_serve_refuses_to_start_on_another_registrys_pointer(two, keys) -> None:  # noqa: F811
    a, b, x, y = two
    _swap(a, b)
    res = _serve(str(b.root), "--trusted-activator-key", str(keys["activator"][1]))
    err = " ".join(res.stderr.split())
    assert res.returncode == 1, err
    assert f"{b.pointer}: the pointer is bound to registry {_ident(a)}, but this registry is {_ident(b)}" in err


def test_a_reload_refuses_another_registrys_pointer_and_keeps_serving(cpu_release_build, tmp_path, keys) -> None:  # noqa: F811,E501
    b_src = copy_release(cpu_release_build.path, tmp_path / "b", version="bound-2")
    a, b = (Registry(tmp_path / name, activator_key=keys["activator"][0]) for name in ("A", "B"))
    for reg in (a, b):
        x, y = reg.publish(cpu_release_build.path), reg.publish(b_src)
    a.activate(y)
    a.activate(x)  # generation 2 in A, naming X
    b.activate(y)  # generation 1 in B, naming Y
    config = ServeConfig(source=b.root, trusted_activator_keys=(keys["activator"][1],), warm_rollback=False,
                         log_stream=io.StringIO())
    with serving(config) as srv:
        assert served_by(srv) == y
        _swap(a, b)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["stage"] == "resolve" and f"bound to registry {_ident(a)}, but this registry is {_ident(b)}" \
            in body["error"], body
        assert body["serving"] == y and served_by(srv) == y
        b.activate(x)  # B's own pointer naming X (generation 2): swapped
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
        assert served_by(srv) == x and srv.service.holder.pointer.registry_id == _ident(b)


def test_diagnose_and_releases_refuse_another_registrys_pointer(two, keys, tmp_path) -> None:  # noqa: F811
    a, b, x, y = two
    pub = str(keys["activator"][1])
    out = ["--out", str(tmp_path / "diag"), "--no-load", "--registry", str(b.root)]
    assert _cli("diagnose", *out, "--trusted-activator-key", pub)[0] == 0
    _swap(a, b)
    code, text = _cli("diagnose", *out, "--trusted-activator-key", pub)
    assert code == 1 and f"bound to registry {_ident(a)}, but this registry is {_ident(b)}" in text, text
    code, text = _cli("releases", "--registry", str(b.root), "--trusted-activator-key", pub)
    assert code == 0 and "REFUSED" in text and f"bound to registry {_ident(a)}" in text, text


def test_the_fleet_controller_does_not_roll_to_another_registrys_pointer(two, keys) -> None:  # noqa: F811
    a, b, x, y = two
    ctrl, log = _controller(b, [keys["activator"][1]])

    async def scenario() -> None:
        assert await _started(ctrl) == y
        _swap(a, b)
        await ctrl._step()
        assert ctrl.plan.roll is None and release_of(ctrl.plan.stable or "") == y
        assert f"bound to registry {_ident(a)}" in _events(log, "fleet_pointer_refused")[-1]["error"]

    asyncio.run(scenario())
