"""Hostile registry pointers (``active.json``), generation hints (``.generation``) and generation-state files
(``--generation-state``), found by the hostile-input hunt on the signed pointer: each test here failed on the code
before its fix. Every one is a clear error naming the file and what is wrong (never a traceback, a hang or a read
without end), and a reload that meets one keeps the release serving."""

from __future__ import annotations

import io
import json
import os

import httpx
import pytest
from test_pointer_seal import _edit, _serve, keys, signed  # noqa: F401 (fixtures)
from test_serve import post, serving
from test_serve_warm_rollback import served_by
from threads import within
from typer.testing import CliRunner

from tileship.cli import app
from tileship.errors import PointerSignatureError, RegistryError
from tileship.release import pointer_seal, pointer_served
from tileship.release.registry import Registry, read_pointer
from tileship.serve import ServeConfig


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.parametrize(("fields", "words"), [
    ({"generation": -5}, "generation is not a whole number"),
    ({"generation": 2.5}, "generation is not a whole number"),
    ({"generation": True}, "generation is not a whole number"),
    ({"generation": 10**400}, "generation is not a whole number"),
    ({"generation": "9" * 5000}, "generation is not a whole number"),
    ({"sealed_by": 5}, "sealed_by is not a key id"),
    ({"sealed_by": "\ud800\u202e"}, "sealed_by is not a key id"),  # printed, it crashed the CLI's console
    ({"sealed_by": "x" * 100_000}, "sealed_by is not a key id"),
    ({"signature": "A" * 100_000}, "signature is not a string of at most 128"),
    ({"signature": ["x"]}, "signature is not a string"),
    ({"release_id": "../../elsewhere"}, "release_id is neither null nor a release id"),
    ({"reference_only": "no"}, "reference_only is not true or false"),
], ids=["gen-negative", "gen-float", "gen-bool", "gen-400-digits", "gen-5000-digit-string", "kid-int",
        "kid-surrogate-rtl", "kid-huge", "sig-huge", "sig-list", "rid-path", "mode-string"])
def test_a_pointer_field_of_the_wrong_shape_is_refused_naming_it(signed, keys, fields, words) -> None:  # noqa: F811
    reg, a, _ = signed
    _edit(reg, **fields)
    with pytest.raises(RegistryError, match=words):
        read_pointer(reg.pointer)
    pub = str(keys["activator"][1])
    for args in (["releases"], ["releases", "--trusted-activator-key", pub], ["activate", a]):
        code, text = _cli(*args, "--registry", str(reg.root))
        assert code == 1 and f"{reg.pointer}: not a tileship active pointer" in text and words in text, text


def test_a_pointer_missing_its_mode_is_refused_not_a_key_error(signed) -> None:  # noqa: F811
    reg, _, _ = signed
    state = json.loads(reg.pointer.read_text())
    del state["reference_only"]
    reg.pointer.write_text(json.dumps(state))
    with pytest.raises(RegistryError, match="reference_only is not true or false"):
        reg.active()


@pytest.mark.parametrize("kind", ["not-utf8", "fifo", "dev-zero", "directory", "2-mib"])
def test_a_pointer_that_is_no_small_json_file_is_refused_at_once(signed, kind) -> None:  # noqa: F811
    reg, a, _ = signed
    good = reg.pointer.read_bytes()
    reg.pointer.unlink()
    if kind == "not-utf8":
        reg.pointer.write_bytes(b'{"\xff": 1}')
    elif kind == "fifo":
        os.mkfifo(reg.pointer)
    elif kind == "dev-zero":
        reg.pointer.symlink_to("/dev/zero")
    elif kind == "directory":
        reg.pointer.mkdir()
    else:
        reg.pointer.write_bytes(good[:-2] + b" " * (2 << 20) + good[-2:])
    exc = within(lambda: read_pointer(reg.pointer))
    assert isinstance(exc, RegistryError) and str(reg.pointer) in exc.message, repr(exc)
    assert "move it aside" in (exc.hint or "")
    code, text = within(lambda: _cli("activate", a, "--registry", str(reg.root)))
    assert code == 1 and str(reg.pointer) in text, text


@pytest.mark.parametrize("kind", ["field", "not-utf8", "directory"])
def test_releases_on_a_refused_pointer_prints_the_error_alone(signed, keys, kind) -> None:  # noqa: F811
    """``tileship releases`` reads the pointer before its table: a refused or unreadable pointer is the error
    naming it and exit 1, no table first (which showed no release active, as if nothing were wrong)."""
    reg, _, _ = signed
    if kind == "field":
        _edit(reg, generation=-5)
    else:
        reg.pointer.unlink()
        reg.pointer.write_bytes(b'{"\xff": 1}') if kind == "not-utf8" else reg.pointer.mkdir()
    for extra in ([], ["--trusted-activator-key", str(keys["activator"][1])]):
        code, text = _cli("releases", "--registry", str(reg.root), *extra)
        assert code == 1 and text.startswith(f"error: {reg.pointer}: "), text
        assert "releases in" not in text and "verification" not in text and "unverified" not in text, text


@pytest.mark.parametrize("kind", ["not-utf8", "other-digits", "huge", "fifo", "directory"])
def test_a_generation_hint_that_is_garbage_counts_as_zero(signed, kind) -> None:  # noqa: F811
    reg, a, _ = signed
    hint = reg.root / pointer_seal.HIGH_WATER
    hint.unlink()
    if kind == "not-utf8":
        hint.write_bytes(b"\xff\xfe7\n")
    elif kind == "other-digits":
        hint.write_text("\u0661\u0662\n")
    elif kind == "huge":
        hint.write_text("9" * 10_000_000)
    elif kind == "fifo":
        os.mkfifo(hint)
    else:
        hint.mkdir()
    active = within(lambda: reg.activate(a))
    assert not isinstance(active, BaseException), repr(active)
    assert active.release_id == a and active.generation == 3  # one above the pointer's 2


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep", "5000-digits", "duplicate-key", "bad-key-id",
                                  "bad-digest", "bool-generation"])
def test_a_generation_state_that_is_not_one_is_refused_at_once(tmp_path, kind) -> None:
    state = tmp_path / "served.json"
    ok = {"generation": 3, "key_id": "ed25519:0123456789abcdef", "digest": "sha256:" + "0" * 64}
    if kind == "fifo":
        os.mkfifo(state)
    elif kind == "dev-zero":
        state.symlink_to("/dev/zero")
    elif kind == "deep":
        state.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "5000-digits":
        state.write_text(json.dumps(ok).replace("3", "9" * 5000, 1))
    elif kind == "duplicate-key":
        state.write_text(json.dumps(ok)[:-1] + ', "generation": 9}')
    else:
        field, value = {"bad-key-id": ("key_id", "\u202e" * 5), "bad-digest": ("digest", "sha256:"),
                        "bool-generation": ("generation", True)}[kind]
        state.write_text(json.dumps({**ok, field: value}))
    exc = within(lambda: pointer_served.read_served(state))
    assert isinstance(exc, PointerSignatureError) and "the generation state is" in exc.message, repr(exc)
    state.unlink()
    state.write_text(json.dumps(ok))
    assert pointer_served.read_served(state) == pointer_seal.Sealed(3, ok["key_id"], ok["digest"])


def test_a_reload_meeting_a_fifo_pointer_answers_and_keeps_serving(cpu_release_build, tmp_path, keys) -> None:  # noqa: F811
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    rid = reg.publish(cpu_release_build.path)
    reg.activate(rid)
    config = ServeConfig(source=reg.root, trusted_activator_keys=(keys["activator"][1],), warm_rollback=False,
                         log_stream=io.StringIO())
    with serving(config) as srv:
        good = reg.pointer.read_bytes()
        for hostile in ("fifo", "field"):
            reg.pointer.unlink()
            if hostile == "fifo":
                os.mkfifo(reg.pointer)
            else:
                reg.pointer.write_bytes(good.replace(b'"generation": 1', b'"generation": -1'))
            r = post(srv, "/v2/repository/reload")
            assert r.status_code == 409, r.text
            assert str(reg.pointer) in r.json()["error"] and r.json()["serving"] == rid
            assert served_by(srv) == rid
            assert httpx.get(srv.url + "/v2/health/ready", timeout=30).json()["ready"] is True
        reg.pointer.unlink()
        reg.pointer.write_bytes(good)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "unchanged", r.text


def test_serve_refuses_to_start_on_a_hostile_generation_state(signed, keys, tmp_path) -> None:  # noqa: F811
    reg, _, _ = signed
    state = tmp_path / "served"
    os.mkfifo(state)
    res = _serve(str(reg.root), "--trusted-activator-key", str(keys["activator"][1]), "--generation-state", str(state))
    err = " ".join(res.stderr.split())
    assert res.returncode == 1, err
    assert f"{state}: the generation state is unreadable (not a regular file (a FIFO))" in err, err
    assert "Traceback" not in res.stderr

