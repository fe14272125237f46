"""Shared-memory region names with ``/`` and other URL-special characters over REST (the region routes
``/v2/{system,cuda}sharedmemory/region/{name}/...``), and the names registration refuses, with the real
tritonclient.http and tritonclient.grpc clients against a server on 127.0.0.1."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer

N = 16
NBYTES = N * 4
# names a gRPC client may register (any string); tritonclient.http sends them through urllib.parse.quote,
# which leaves "/" as is and percent-encodes the rest
NAMES = ["team/a", "a/b/c", "/lead", "trail/", "a b", "x?y#z", "50%", "%2F", "ünï/cödé", "a/register", "b/status"]


@pytest.fixture(scope="module")
def server(grpc_server: BackgroundServer) -> BackgroundServer:
    return grpc_server


@pytest.fixture
def hc(server) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0)
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def gc(server) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def region() -> Iterator[tuple[Any, str]]:
    """(handle, key) of a fresh /dev/shm object of ``NBYTES`` bytes."""
    key = f"/tileship_test_{uuid.uuid4().hex[:12]}"
    h = shm.create_shared_memory_region("names", key, NBYTES)
    yield h, key
    shm.destroy_shared_memory_region(h)


def _grpc_names(gc: tg.InferenceServerClient) -> set[str]:
    return set(gc.get_system_shared_memory_status(as_json=True).get("regions", {}))


@pytest.mark.parametrize("name", NAMES)
def test_a_name_registered_over_grpc_is_addressed_over_rest(hc, gc, region, name):
    _, key = region
    gc.register_system_shared_memory(name, key, NBYTES)
    assert hc.get_system_shared_memory_status(name) == [{"name": name, "key": key, "offset": 0,
                                                          "byte_size": NBYTES}]
    hc.unregister_system_shared_memory(name)  # one region, not every one
    assert _grpc_names(gc) == set()


@pytest.mark.parametrize("name", NAMES)
def test_a_name_registered_over_rest_is_the_decoded_name(server, hc, gc, region, name):
    _, key = region
    hc.register_system_shared_memory(name, key, NBYTES)  # "/" raw in the path
    assert _grpc_names(gc) == {name}
    hc.unregister_system_shared_memory(name)
    url = f"{server.url}/v2/systemsharedmemory/region/{quote(name, safe='')}"  # "/" as %2F
    r = httpx.post(url + "/register", json={"key": key, "offset": 0, "byte_size": NBYTES}, timeout=30.0)
    assert r.status_code == 200, r.text
    assert _grpc_names(gc) == {name}
    r = httpx.get(url + "/status", timeout=30.0)
    assert r.status_code == 200 and r.json()[0]["name"] == name, r.text
    assert httpx.post(url + "/unregister", timeout=30.0).status_code == 200
    assert _grpc_names(gc) == set()


def test_inference_reads_and_writes_a_region_whose_name_has_a_slash(hc, region):
    h, key = region
    name = "in/out"
    a = np.arange(N, dtype=np.float32)
    shm.set_shared_memory_region(h, [a])
    hc.register_system_shared_memory(name, key, NBYTES)
    inputs = [th.InferInput("A", [N], "FP32"), th.InferInput("B", [N], "FP32")]
    inputs[0].set_shared_memory(name, NBYTES)
    inputs[1].set_data_from_numpy(np.full(N, 2, np.float32))
    out = th.InferRequestedOutput("C")
    out.set_shared_memory(name, NBYTES)
    hc.infer("add", inputs, outputs=[out])
    assert (shm.get_contents_as_numpy(h, np.float32, [N]) == a + 2).all()
    hc.unregister_system_shared_memory(name)
    assert hc.get_system_shared_memory_status() == []


def test_the_longest_name_is_registered_and_one_more_character_is_not(hc, gc, region):
    _, key = region
    hc.register_system_shared_memory("n" * 256, key, NBYTES)
    assert hc.get_system_shared_memory_status("n" * 256)[0]["name"] == "n" * 256
    with pytest.raises(InferenceServerException) as e:
        hc.register_system_shared_memory("n" * 257, key, NBYTES)
    assert e.value.status() == "400" and "1 to 256 characters" in e.value.message(), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gc.register_system_shared_memory("m" * 257, key, NBYTES)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "1 to 256 characters" in e.value.message()


@pytest.mark.parametrize("kind", ["system", "cuda"])
@pytest.mark.parametrize("path_name,shown", [("a%00b", "'a\\x00b'"), ("line%0Abreak", "'line\\nbreak'"),
                                             ("tab%09", "'tab\\t'"), ("del%7F", "'del\\x7f'"), ("", "''")],
                         ids=["nul", "newline", "tab", "del", "empty"])
def test_a_bad_name_is_a_json_400_naming_it(server, hc, region, kind, path_name, shown):
    _, key = region
    body = {"key": key, "offset": 0, "byte_size": NBYTES} if kind == "system" else \
        {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": NBYTES}
    r = httpx.post(f"{server.url}/v2/{kind}sharedmemory/region/{path_name}/register", json=body, timeout=30.0)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    assert "a region name must be a string of 1 to 256 characters and no control characters" in r.json()["error"]
    assert f"got {shown}" in r.json()["error"], r.json()
    assert hc.get_system_shared_memory_status() == []


def test_grpc_refuses_a_name_with_a_nul(gc, region):
    _, key = region
    with pytest.raises(InferenceServerException) as e:
        gc.register_system_shared_memory("a\x00b", key, NBYTES)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "no control characters" in e.value.message()
    assert _grpc_names(gc) == set()


def test_an_unknown_name_with_a_slash_is_404_naming_it(server, hc, gc, region):
    _, key = region
    gc.register_system_shared_memory("x/y", key, NBYTES)
    for path, method in [("region/x/z/unregister", "POST"), ("region/x%2Fz/status", "GET")]:
        r = httpx.request(method, f"{server.url}/v2/systemsharedmemory/{path}", timeout=30.0)
        assert r.status_code == 404, r.text
        assert r.json()["error"] == "unknown shared-memory region 'x/z': registered: x/y"
    assert _grpc_names(gc) == {"x/y"}


@pytest.mark.parametrize("encoded", ["%C3", "%ED%A0%80", "a%FFb", "%C3%28"], ids=["cut", "surrogate", "ff", "bad-tail"])
def test_a_name_that_is_not_utf8_once_decoded_is_a_400_not_another_region(server, hc, region, encoded):
    """The server decodes the path with U+FFFD for bytes that are not UTF-8, so ``%C3`` would register (or
    unregister) the region named U+FFFD; it is refused naming the name as sent, and that region stays."""
    _, key = region
    hc.register_system_shared_memory("\ufffd", key, NBYTES)  # sent as %EF%BF%BD: a real name
    base = f"{server.url}/v2/systemsharedmemory/region/{encoded}"
    for method, path in (("POST", "/register"), ("GET", "/status"), ("POST", "/unregister")):
        body = {"key": key, "offset": 0, "byte_size": NBYTES} if path == "/register" else None
        r = httpx.request(method, base + path, json=body, timeout=30.0)
        assert r.status_code == 400, (path, r.text)
        assert "not UTF-8 once percent-decoded" in r.json()["error"] and encoded in r.json()["error"], r.text
    assert [r["name"] for r in hc.get_system_shared_memory_status()] == ["\ufffd"]


@pytest.mark.parametrize("kind,body,key_named", [
    ("system", '{"key": "%s", "offset": 0, "byte_size": 64, "byte_size": 1}', "byte_size"),
    ("system", '{"key": "/nowhere", "key": "%s", "offset": 0, "byte_size": 64}', "key"),
    ("cuda", '{"raw_handle": {"b64": "", "b64": ""}, "device_id": 0, "byte_size": 64}', "b64"),
    ("cuda", '{"raw_handle": {"b64": ""}, "device_id": 0, "device_id": 1, "byte_size": 64}', "device_id")],
    ids=["system-size", "system-key", "cuda-nested", "cuda-device"])
def test_a_register_body_with_a_key_twice_is_a_json_400_naming_it(server, hc, region, kind, body, key_named):
    """orjson would take the last of two equal keys; a body that says two things is refused, nothing registered."""
    _, key = region
    r = httpx.post(f"{server.url}/v2/{kind}sharedmemory/region/twice/register", timeout=30.0,
                   content=body.replace("%s", key), headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    assert f"key '{key_named}' appears twice in one object" in r.json()["error"], r.text
    assert hc.get_system_shared_memory_status() == []
    assert httpx.get(f"{server.url}/v2/cudasharedmemory/status", timeout=30.0).json() == []


def test_a_register_body_with_colons_in_its_strings_is_not_refused(server, hc, region):
    """The duplicate check parses again only a body with more colons than keys: here the key's colons."""
    _, key = region
    r = httpx.post(f"{server.url}/v2/systemsharedmemory/region/a:b:c/register", timeout=30.0,
                   content=f'{{"key": "{key}", "byte_size": {NBYTES}, "note": "x:y:z"}}')
    assert r.status_code == 200, r.text
    assert hc.get_system_shared_memory_status("a:b:c")[0]["byte_size"] == NBYTES
