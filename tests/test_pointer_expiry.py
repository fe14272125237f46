"""An expiry in the signed pointer (``release.pointer_expiry``): ``activate`` / ``rollback --valid-for DURATION``
(or ``TILESHIP_POINTER_VALID_FOR``) write ``expires`` among the signed fields; every reader that checks the seal
refuses the pointer once that instant has passed, naming it: ``pointer_seal.check`` (the clock injected here, no
sleeping), ``tileship serve`` at start (exit 1) and on reload (409, the release serving keeps serving), ``tileship
diagnose`` (which also warns when the expiry is less than a day away), ``tileship releases`` and the Ray fleet's
controller. A malformed ``expires`` is refused naming the field; pointers without one and unsigned pointers behave
as before. Real keys (``tileship keygen``), real registries in tmp_path, a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import test_pointer_seal
from test_pointer_seal import _serve, _trust
from test_pointer_seal_readers import _cli, _controller, _events, _started
from test_registry import fake_release
from test_serve import copy_release, post, serving
from test_serve_warm_rollback import served_by

from tileship.errors import PointerExpiredError, PointerSignatureError, RegistryError
from tileship.release import bundle, pointer_expiry, pointer_seal
from tileship.release.registry import Registry, read_pointer, write_pointer
from tileship.serve import ServeConfig
from tileship.serve.fleet_plan import release_of

keys = test_pointer_seal.keys  # its fixture
WEEK = timedelta(days=7)
PAST = "2001-02-03T04:05:06Z"


def _at(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@pytest.fixture
def two(tmp_path: Path, keys) -> tuple[Registry, str, str]:
    """A registry where A, then B were activated with the activator key, B's pointer valid for a week."""
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0], valid_for=WEEK)
    a, b = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b"))
    reg.activate(a)
    reg.activate(b)
    return reg, a, b


def _reseal(reg: Registry, key: Path, release: str | None = None, **fields: Any) -> None:
    """The registry's pointer sealed anew by ``key`` at the next generation, with ``fields`` set (``expires``: any
    value, as a writer with a wrong clock or a bug could seal it), naming ``release`` when given."""
    state = read_pointer(reg.pointer)
    body = {k: v for k, v in state.items() if k not in ("expires", "signature")}
    body.update(generation=pointer_seal.generation_of(state) + 1, **fields)
    if release is not None:
        body["release_id"] = release
    private = bundle.load_private_key(key)
    body["sealed_by"] = bundle.key_id(private.public_key())
    body["signature"] = base64.b64encode(private.sign(pointer_seal.signed_bytes(body))).decode()
    write_pointer(reg.pointer, body)


# -- the check, with the clock injected ------------------------------------------------------------------------

def test_a_pointer_with_a_validity_is_accepted_until_its_expiry_and_refused_from_then_on(two, keys) -> None:
    reg, _, b = two
    state = read_pointer(reg.pointer)
    expires = state["expires"]
    assert pointer_expiry.INSTANT.fullmatch(expires), expires
    assert abs(_at(expires) - (datetime.now(UTC) + WEEK)) < timedelta(minutes=5)
    trust = _trust(keys["activator"][1])
    for before in (datetime.now(UTC), _at(expires) - timedelta(seconds=1)):
        sealed = pointer_seal.check(reg.pointer, state, trust, now=before)
        assert sealed.expires == expires and sealed.generation == 2
    for after in (_at(expires), _at(expires) + timedelta(days=400)):
        with pytest.raises(PointerExpiredError) as err:
            pointer_seal.check(reg.pointer, state, trust, now=after)
        assert err.value.expires == expires and f"the pointer expired at {expires}" in err.value.message
        assert str(reg.pointer) in err.value.message and isinstance(err.value, PointerSignatureError)
    assert reg.active().expires == expires and reg.active().release_id == b


def test_the_expiry_is_signed(two, keys) -> None:
    reg, _, _ = two
    state = read_pointer(reg.pointer)
    state["expires"] = "2999-01-01T00:00:00Z"  # pushed forward without the key
    with pytest.raises(PointerSignatureError, match="does not verify"):
        pointer_seal.check(reg.pointer, state, _trust(keys["activator"][1]))
    del state["expires"]  # or removed
    with pytest.raises(PointerSignatureError, match="does not verify"):
        pointer_seal.check(reg.pointer, state, _trust(keys["activator"][1]))


@pytest.mark.parametrize("value", ["tomorrow", "2026-13-01T00:00:00Z", "2027-02-30T00:00:00Z",
                                   "2026-01-01T00:00:00+00:00", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00.5Z",
                                   1767225600, None, ["2026-01-01T00:00:00Z"]],
                         ids=lambda v: repr(v)[:24])
def test_a_malformed_expiry_is_refused_naming_the_field(two, keys, value: Any) -> None:
    reg, _, _ = two
    _reseal(reg, keys["activator"][0], expires=value)  # validly sealed, with that value
    with pytest.raises(PointerSignatureError, match="malformed pointer field 'expires'") as err:
        pointer_seal.check(reg.pointer, read_pointer(reg.pointer), _trust(keys["activator"][1]))
    assert not isinstance(err.value, PointerExpiredError)


def test_pointers_without_an_expiry_and_unsigned_pointers_behave_as_before(tmp_path, keys) -> None:
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    a = reg.publish(fake_release(tmp_path, "a")[0])
    reg.activate(a)
    state = read_pointer(reg.pointer)
    assert "expires" not in state and reg.active().expires is None
    far = datetime(2999, 1, 1, tzinfo=UTC)
    assert pointer_seal.check(reg.pointer, state, _trust(keys["activator"][1]), now=far).expires is None
    Registry(reg.root).activate_reference()  # unsigned, no validity: written as before
    assert "expires" not in read_pointer(reg.pointer)
    with pytest.raises(RegistryError, match="needs an activator key"):
        Registry(reg.root, valid_for=WEEK).activate(a)  # an expiry nobody would check is refused...
    assert read_pointer(reg.pointer)["reference_only"] is True, "...and nothing was written"


def test_activating_the_active_release_again_with_a_validity_refreshes_the_pointer(two, keys) -> None:
    reg, _, b = two
    before = read_pointer(reg.pointer)
    Registry(reg.root, activator_key=keys["activator"][0]).activate(b)  # no validity: unchanged, as before
    assert read_pointer(reg.pointer) == before
    reg.valid_for = timedelta(days=30)
    reg.activate(b)
    after = read_pointer(reg.pointer)
    assert after["generation"] == 3 and after["release_id"] == b and after["history"] == before["history"]
    assert _at(after["expires"]) - _at(before["expires"]) > timedelta(days=22)


# -- the command line ----------------------------------------------------------------------------------------------

def test_activate_and_rollback_take_valid_for_and_the_variable(tmp_path, keys) -> None:
    reg = Registry(tmp_path / "reg")
    a, b = (reg.publish(fake_release(tmp_path, t)[0]) for t in ("a", "b"))
    base = ["--registry", str(reg.root), "--sign-key", str(keys["activator"][0])]
    code, text = _cli("activate", a, *base, "--valid-for", "12h")
    assert code == 0 and "valid until" in text and "warning" in text and "expires at" in text, text  # < a day
    assert abs(_at(read_pointer(reg.pointer)["expires"]) - datetime.now(UTC) - timedelta(hours=12)) < timedelta(
        minutes=5)
    code, text = _cli("activate", b, *base, env={"TILESHIP_POINTER_VALID_FOR": "2w"})
    assert code == 0 and "warning" not in text, text
    assert _at(read_pointer(reg.pointer)["expires"]) - datetime.now(UTC) > timedelta(days=13)
    code, text = _cli("rollback", *base, "--valid-for", "3d", env={"TILESHIP_POINTER_VALID_FOR": "2w"})  # flag wins
    assert code == 0 and timedelta(days=2) < _at(read_pointer(reg.pointer)["expires"]) - datetime.now(UTC) < timedelta(
        days=4), text
    gen = read_pointer(reg.pointer)["generation"]
    for bad in ("7", "7 days", "0d", "-1d", "1y", "99999d"):
        code, text = _cli("activate", b, *base, "--valid-for", bad)
        assert code == 1 and f"--valid-for {bad!r}: not a duration" in text, text
    code, text = _cli("activate", b, *base, env={"TILESHIP_POINTER_VALID_FOR": "soon"})
    assert code == 1 and "TILESHIP_POINTER_VALID_FOR 'soon': not a duration" in text, text
    code, text = _cli("activate", b, "--registry", str(reg.root), "--valid-for", "1d")  # no key
    assert code == 1 and "needs an activator key" in text, text
    assert read_pointer(reg.pointer)["generation"] == gen, "a refused validity wrote a pointer"


def test_diagnose_warns_within_a_day_and_refuses_an_expired_pointer(two, keys, tmp_path) -> None:
    reg, a, b = two
    pub = str(keys["activator"][1])
    out = ["--out", str(tmp_path / "diag"), "--no-load", "--registry", str(reg.root), "--trusted-activator-key", pub]
    code, text = _cli("diagnose", *out)
    assert code == 0 and "expires at" not in text, text  # a week away: no warning
    Registry(reg.root, activator_key=keys["activator"][0], valid_for=timedelta(hours=3)).activate(b)
    code, text = _cli("diagnose", *out)
    assert code == 0 and "warning: the active pointer expires at" in text, text
    assert re.search(r"in (3\.0|2\.[5-9]) h", text), text  # three hours from the write, less the test's time
    _reseal(reg, keys["activator"][0], expires=PAST)
    code, text = _cli("diagnose", *out)
    assert code == 1 and f"the pointer expired at {PAST}" in text, text


def test_releases_shows_the_expiry_and_refuses_an_expired_pointer(two, keys) -> None:
    reg, _, _ = two
    pub = str(keys["activator"][1])
    listing = ["releases", "--registry", str(reg.root)]
    expires = read_pointer(reg.pointer)["expires"]
    code, text = _cli(*listing, "--trusted-activator-key", pub)
    assert code == 0 and f"valid until {expires}; verified" in text, text
    _reseal(reg, keys["activator"][0], expires=PAST)
    code, text = _cli(*listing, "--trusted-activator-key", pub)
    assert code == 0 and "REFUSED" in text and f"expired at {PAST}" in text, text


def test_the_fleet_controller_does_not_roll_to_an_expired_pointer(two, keys) -> None:
    reg, a, b = two
    ctrl, log = _controller(reg, [keys["activator"][1]])

    async def scenario() -> None:
        assert await _started(ctrl) == b
        _reseal(reg, keys["activator"][0], release=a, expires=PAST)  # newer, sealed, naming A, expired
        await ctrl._step()
        assert ctrl.plan.roll is None and release_of(ctrl.plan.stable or "") == b
        assert f"expired at {PAST}" in _events(log, "fleet_pointer_refused")[-1]["error"]
        reg.activate(a)  # a fresh pointer (valid a week): rolled
        await ctrl._step()
        assert ctrl.plan.roll is not None and release_of(ctrl.plan.roll.target) == a

    asyncio.run(scenario())


# -- tileship serve ------------------------------------------------------------------------------------------------

def test_serve_refuses_to_start_on_an_expired_pointer(two, keys) -> None:
    reg, _, _ = two
    _reseal(reg, keys["activator"][0], expires=PAST)
    res = _serve(str(reg.root), "--trusted-activator-key", str(keys["activator"][1]))
    err = " ".join(res.stderr.split())
    assert res.returncode == 1, err
    assert f"{reg.pointer}: the pointer expired at {PAST}" in err and "--valid-for" in err, err


def test_a_reload_refuses_an_expired_pointer_and_keeps_serving(cpu_release_build, tmp_path, keys) -> None:
    b_src = copy_release(cpu_release_build.path, tmp_path / "b", version="expiry-2")
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0], valid_for=WEEK)
    id_a, id_b = reg.publish(cpu_release_build.path), reg.publish(b_src)
    reg.activate(id_a)
    config = ServeConfig(source=reg.root, trusted_activator_keys=(keys["activator"][1],), warm_rollback=False,
                         log_stream=io.StringIO())
    with serving(config) as srv:
        assert served_by(srv) == id_a and srv.service.holder.pointer.expires is not None
        for release in (id_b, id_a):  # another release, then the one serving: both refused once expired
            _reseal(reg, keys["activator"][0], release=release, expires=PAST)
            r = post(srv, "/v2/repository/reload")
            assert r.status_code == 409, r.text
            body = r.json()
            assert body["stage"] == "resolve" and f"{reg.pointer}: the pointer expired at {PAST}" in body["error"]
            assert body["serving"] == id_a and served_by(srv) == id_a
        reg.activate(id_b)  # the activator seals a fresh pointer: followed
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
        assert served_by(srv) == id_b and srv.service.holder.pointer.expires == json.loads(
            reg.pointer.read_text())["expires"]
