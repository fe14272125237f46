"""A reader told which registry to trust (``serve --trusted-registry-id ID``, ``TILESHIP_TRUSTED_REGISTRY_ID``,
``pointer_seal.check(registry=)``): the registry id is otherwise trusted on first use, so a fresh server (no
``--generation-state``) whose registry root was given another registry's ``registry.json`` *and* pointer, or had
its ``registry.json`` removed and a pointer from before registry ids put in, served that registry's release. With
the id given, only a pointer bound to it is accepted, the first one included: ``tileship serve`` exits 1 at start,
a reload answers 409, ``diagnose`` and ``releases`` refuse, the Ray controller does not start on it. Real keys, real
registries in tmp_path."""

from __future__ import annotations

import asyncio
import io
import shutil

import pytest
import test_pointer_binding
from test_pointer_binding import _ident, _legacy, _swap
from test_pointer_seal import _serve, _trust
from test_pointer_seal_readers import _cli, _controller
from test_serve import copy_release, post, serving
from test_serve_warm_rollback import served_by

from tileship.errors import PointerSignatureError, RegistryError
from tileship.release import registry_id as regid
from tileship.release.registry import Registry
from tileship.serve import ServeConfig
from tileship.serve.source import resolve

keys, two = test_pointer_binding.keys, test_pointer_binding.two  # its fixtures


def _impersonate(a: Registry, b: Registry) -> None:
    """B's root given A's identity and A's pointer (validly sealed, bound to A): what a first start cannot tell."""
    shutil.copy(a.root / regid.NAME, b.root / regid.NAME)
    _swap(a, b)


def test_a_fresh_reader_trusts_the_first_registry_id_it_sees_unless_told_which(two, keys) -> None:
    a, b, x, y = two
    trust = _trust(keys["activator"][1])
    own = _ident(b)
    assert resolve(b.root, activator_keys=trust, registry_id=own).path == b.releases_dir / y
    _impersonate(a, b)
    assert resolve(b.root, activator_keys=trust).path == b.releases_dir / x, "trusted on first use, as documented"
    with pytest.raises(PointerSignatureError) as exc:
        resolve(b.root, activator_keys=trust, registry_id=own)
    assert f"{b.pointer}: the pointer is bound to registry {_ident(a)}, but this reader trusts only registry {own}" \
        in exc.value.message
    assert resolve(b.root, registry_id=own).path == b.releases_dir / x, "without trusted keys nothing is checked"


def test_a_pointer_from_before_registry_ids_is_refused_when_an_id_is_trusted(two, keys) -> None:
    a, b, x, y = two
    trust, own = _trust(keys["activator"][1]), _ident(b)
    (b.root / regid.NAME).unlink()
    _legacy(b, keys["activator"][0])  # sealed, unbound, in a registry without registry.json: accepted on first use
    assert resolve(b.root, activator_keys=trust).sealed.registry_id is None
    with pytest.raises(PointerSignatureError, match=f"bound to registry none, but this reader trusts only "
                                                    f"registry {own}"):
        resolve(b.root, activator_keys=trust, registry_id=own)


def test_the_variable_is_honoured_by_every_reader(two, keys, tmp_path, monkeypatch) -> None:
    a, b, x, y = two
    pub = str(keys["activator"][1])
    own = _ident(b)
    _impersonate(a, b)
    monkeypatch.setenv("TILESHIP_TRUSTED_REGISTRY_ID", own)
    with pytest.raises(PointerSignatureError, match=f"trusts only registry {own}"):
        resolve(b.root, activator_keys=_trust(keys["activator"][1]))
    code, text = _cli("diagnose", "--out", str(tmp_path / "diag"), "--no-load", "--registry", str(b.root),
                      "--trusted-activator-key", pub)
    assert code == 1 and f"trusts only registry {own}" in text, text
    code, text = _cli("releases", "--registry", str(b.root), "--trusted-activator-key", pub)
    assert code == 0 and "REFUSED" in text and f"trusts only registry {own}" in text, text
    assert f"bound to registry id {_ident(a)}" in text, "releases names the id to pin"
    monkeypatch.setenv("TILESHIP_TRUSTED_REGISTRY_ID", "not-an-id")
    with pytest.raises(RegistryError, match="TILESHIP_TRUSTED_REGISTRY_ID 'not-an-id': not a registry id"):
        resolve(b.root, activator_keys=_trust(keys["activator"][1]))


def test_serve_refuses_to_start_on_another_registrys_identity_when_told_which(two, keys) -> None:
    a, b, x, y = two
    pub = str(keys["activator"][1])
    own = _ident(b)
    _impersonate(a, b)
    res = _serve(str(b.root), "--trusted-activator-key", pub, "--trusted-registry-id", own)
    err = " ".join(res.stderr.split())
    assert res.returncode == 1 and f"bound to registry {_ident(a)}, but this reader trusts only registry {own}" \
        in err, err
    res = _serve(str(b.root), "--trusted-activator-key", pub, env={"TILESHIP_TRUSTED_REGISTRY_ID": own})
    assert res.returncode == 1 and f"trusts only registry {own}" in " ".join(res.stderr.split()), res.stderr
    for args, words in ((["--trusted-activator-key", pub, "--trusted-registry-id", "B"], "not a registry id"),
                        (["--trusted-registry-id", own], "give --trusted-activator-key")):
        res = _serve(str(b.root), *args)
        assert res.returncode == 1 and words in " ".join(res.stderr.split()), res.stderr


def test_a_server_told_the_registry_id_refuses_others_on_reload_and_keeps_serving(
        cpu_release_build, tmp_path, keys) -> None:
    b_src = copy_release(cpu_release_build.path, tmp_path / "b", version="trusted-id-2")
    a, b = (Registry(tmp_path / name, activator_key=keys["activator"][0]) for name in ("A", "B"))
    for reg in (a, b):
        x, y = reg.publish(cpu_release_build.path), reg.publish(b_src)
    a.activate(y)
    a.activate(x)
    b.activate(y)
    config = ServeConfig(source=b.root, trusted_activator_keys=(keys["activator"][1],), warm_rollback=False,
                         trusted_registry_id=_ident(b), log_stream=io.StringIO())
    with serving(config) as srv:
        assert served_by(srv) == y
        _impersonate(a, b)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 409 and f"trusts only registry {config.trusted_registry_id}" in r.json()["error"]
        assert served_by(srv) == y


def test_the_fleet_controller_does_not_start_on_another_registrys_identity(two, keys) -> None:
    a, b, x, y = two
    own = _ident(b)
    _impersonate(a, b)
    ctrl, _ = _controller(b, [keys["activator"][1]], registry_id=own)
    with pytest.raises(PointerSignatureError, match=f"trusts only registry {own}"):
        asyncio.run(ctrl.start())
