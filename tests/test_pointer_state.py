"""The pointer a server served, kept across restarts (``tileship serve --generation-state FILE``,
``TILESHIP_POINTER_STATE``; ``pointer_served.write_served``/``read_served``): a restarted server refuses a validly
sealed pointer older than the one it served before, at start (exit 1) and at reload. Without the option a fresh
server trusts the first sealed pointer, as before. Real keys, registries and, for the wiring, a real server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import test_pointer_seal
from test_pointer_seal import _serve
from test_serve import copy_release, post, serving

from tileship.errors import PointerSignatureError
from tileship.release import pointer_seal, pointer_served
from tileship.release.registry import Registry
from tileship.serve import ServeConfig
from tileship.serve.holder import ReleaseHolder

keys, signed = test_pointer_seal.keys, test_pointer_seal.signed  # its fixtures


def _holder(reg: Registry, pub: Path, state: Path | None) -> ReleaseHolder:
    def never(*_: Any) -> Any:
        raise AssertionError("nothing is loaded here")

    return ReleaseHolder(reg.root, never, activator_keys=[pub], generation_state=state)


def test_a_restarted_holder_refuses_a_pointer_older_than_the_one_it_served(signed, keys, tmp_path) -> None:
    reg, a, b = signed
    pub, state = keys["activator"][1], tmp_path / "state" / "served.json"
    state.parent.mkdir()
    gen2 = reg.pointer.read_bytes()
    reg.rollback()  # generation 3 names A
    first = _holder(reg, pub, state)
    assert first.pointer is None  # a first start: nothing kept yet
    target = first.resolve()
    first.swap(object(), target.sealed)  # type: ignore[arg-type]  (what a reload does once A is loaded)
    kept = pointer_served.read_served(state)
    assert kept == target.sealed and kept is not None and kept.generation == 3
    assert json.loads(state.read_text())["generation"] == 3 and list(state.parent.iterdir()) == [state]
    reg.pointer.write_bytes(gen2)  # replayed while the server was down
    with pytest.raises(PointerSignatureError, match="generation 2 is older than generation 3"):
        _holder(reg, pub, state).resolve()
    assert _holder(reg, pub, None).resolve().path == reg.releases_dir / b, "without the option: trusted on first use"
    reg.activate(a)  # generation 4: accepted, and kept once served
    again = _holder(reg, pub, state)
    assert again.unchanged(again.resolve(), None) is False  # nothing serves yet: not kept
    again.swap(object(), again.resolve().sealed)  # type: ignore[arg-type]
    assert pointer_served.read_served(state).generation == 4  # type: ignore[union-attr]


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"generation": 3}', b'{"generation": -1, "key_id": "k", '
                                  b'"digest": "sha256:0"}'])
def test_a_state_file_that_is_not_one_is_refused(tmp_path, body: bytes) -> None:
    (tmp_path / "s").write_bytes(body)
    with pytest.raises(PointerSignatureError, match="the generation state is"):
        pointer_served.read_served(tmp_path / "s")


def test_serve_refuses_to_start_on_a_pointer_older_than_the_state_kept(signed, keys, tmp_path) -> None:
    reg, a, b = signed
    pub, state = keys["activator"][1], tmp_path / "served.json"
    gen2 = reg.pointer.read_bytes()
    reg.rollback()
    sealed = pointer_seal.follow(reg.root, pointer_seal.trusted([pub]))[2]
    assert sealed is not None
    pointer_served.write_served(state, sealed)
    reg.pointer.write_bytes(gen2)
    res = _serve(str(reg.root), "--trusted-activator-key", str(pub), "--generation-state", str(state))
    err = " ".join(res.stderr.split())
    assert res.returncode == 1 and "generation 2 is older than generation 3" in err, err
    res = _serve(str(reg.root), "--trusted-activator-key", str(pub), env={"TILESHIP_POINTER_STATE": str(state)})
    assert res.returncode == 1 and "generation 2 is older than generation 3" in " ".join(res.stderr.split())
    res = _serve(str(reg.root), "--generation-state", str(state))  # no trusted key: the option would do nothing
    assert res.returncode == 1 and "--trusted-activator-key" in " ".join(res.stderr.split()), res.stderr


def test_a_server_keeps_the_pointer_it_serves(cpu_release_build, tmp_path, keys) -> None:
    reg = Registry(tmp_path / "reg", activator_key=keys["activator"][0])
    id_a = reg.publish(cpu_release_build.path)
    id_b = reg.publish(copy_release(cpu_release_build.path, tmp_path / "b", version="kept-2"))
    reg.activate(id_a)
    state = tmp_path / "served.json"
    config = ServeConfig(source=reg.root, trusted_activator_keys=(keys["activator"][1],), generation_state=state,
                         warm_rollback=False, log_stream=io.StringIO())
    with serving(config) as srv:
        assert pointer_served.read_served(state) == srv.service.holder.pointer
        assert srv.service.holder.pointer is not None and srv.service.holder.pointer.generation == 1
        reg.activate(id_b)
        assert post(srv, "/v2/repository/reload").json()["result"] == "swapped"
        assert json.loads(state.read_text())["generation"] == 2
