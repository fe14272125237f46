"""Hostile REST inputs found by the gRPC/shm hunt, against a real server on 127.0.0.1: each test
here failed on the code before its fix (see the commit that added it)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def server(grpc_server):
    return grpc_server


def test_repository_index_reads_ready_and_refuses_a_malformed_body(server):
    """Triton's index body ``{"ready": true}`` lists only the models ready now, as gRPC's
    RepositoryIndex(ready=True) does; a body that is no such object is a 400 naming it. The REST
    route used to ignore its body: unloaded models listed under ready, malformed JSON answered 200."""
    url = server.url + "/v2/repository/index"
    assert httpx.post(server.url + "/v2/repository/models/add/unload", timeout=30).status_code == 200
    try:
        every = [(m["name"], m["state"]) for m in httpx.post(url, timeout=30).json()]
        assert every == [("add", "UNAVAILABLE"), ("rmsnorm_cpu", "READY")]
        assert [(m["name"], m["state"]) for m in httpx.get(url, timeout=30).json()] == every
        assert [(m["name"], m["state"]) for m in httpx.post(url, json={"ready": False}, timeout=30).json()] == every
        ready = httpx.post(url, json={"ready": True}, timeout=30)
        assert [(m["name"], m["state"]) for m in ready.json()] == [("rmsnorm_cpu", "READY")], ready.text
        for body in (b"{bad", b"[1]", b'{"ready": "yes"}', b'{"ready": 1}'):
            r = httpx.post(url, content=body, timeout=30)
            assert r.status_code == 400 and "ready" in r.json()["error"], (body, r.text)
    finally:
        assert httpx.post(server.url + "/v2/repository/models/add/load", timeout=30).status_code == 200
