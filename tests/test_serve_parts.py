"""``PartsResponse``: a response body sent as its parts, or joined into one write when small."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tileship.serve.middleware import JOIN_BYTES, PartsResponse


def _sent(parts: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(PartsResponse(200, parts, b"application/octet-stream", [(b"x-a", b"1")])({}, None, send))
    return messages


def test_a_small_body_goes_out_in_one_piece_with_its_length():
    tensor = np.arange(16, dtype=np.float32)
    messages = _sent([b'{"outputs":[]}', memoryview(tensor).cast("B")])
    start, *bodies = messages
    assert start["status"] == 200 and (b"content-length", str(14 + 64).encode()) in start["headers"]
    assert (b"x-a", b"1") in start["headers"]
    assert len(bodies) == 1 and not bodies[0]["more_body"]
    assert bytes(bodies[0]["body"]) == b'{"outputs":[]}' + tensor.tobytes()


def test_a_large_body_goes_out_part_by_part_without_a_join():
    tensor = np.ones(JOIN_BYTES // 4 + 1, dtype=np.float32)  # one element past the join limit
    view = memoryview(tensor).cast("B")
    messages = _sent([b"{}", view])
    start, *bodies = messages
    assert (b"content-length", str(2 + tensor.nbytes).encode()) in start["headers"]
    assert [b["more_body"] for b in bodies] == [True, False]
    assert bodies[1]["body"] is view  # the tensor's own memory, not a copy


def test_only_the_two_inference_routes_take_the_direct_path():
    """``infer_path_params`` matches what Starlette's ``{name}``/``{version}`` routes match for POST
    .../infer, and hands everything else (other methods, other paths, empty or extra segments, a
    root path) to the Starlette app, so 404/405/redirects there stay as they were."""
    from tileship.serve.middleware import infer_path_params

    def params(path: str, method: str = "POST", root: str = "") -> Any:
        return infer_path_params({"method": method, "path": path, "root_path": root})

    assert params("/v2/models/add/infer") == {"name": "add"}
    assert params("/v2/models/a.b-c_1/versions/0123abcd/infer") == {"name": "a.b-c_1", "version": "0123abcd"}
    assert params("/v2/models/stats/infer") == {"name": "stats"}  # as Starlette: {name} matches "stats"
    for path in ("/v2/models//infer", "/v2/models/add/infer/", "/v2/models/add", "/v2/models/add/versions//infer",
                 "/v2/models/add/versions/1/infer/x", "/v2/models/add/ready", "/v3/models/add/infer",
                 "/v2/model/add/infer", "//v2/models/add/infer", "/v2/models/add/version/1/infer", ""):
        assert params(path) is None, path
    assert params("/v2/models/add/infer", method="GET") is None
    assert params("/v2/models/add/infer", root="/proxy") is None


def test_the_direct_path_sends_each_id_and_release_header_once(cpu_release_build):
    """An answered inference skips ``RequestIds``' header wrapper (``PartsResponse.complete``): its
    response still carries the request id, release, kernel revision and evidence headers, each once; a
    duplicated request header counts by its first value, as Starlette's ``Headers.get`` reads it."""
    import io
    import json

    from tileship.serve import ServeConfig
    from tileship.serve.routes import create_app

    app = create_app(ServeConfig(source=cpu_release_build.path, log_stream=io.StringIO()))
    a = np.arange(8, dtype=np.float32)
    head = json.dumps({"inputs": [{"name": n, "shape": [8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 32}} for n in ("A", "B")],
                       "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    body = head + a.tobytes() * 2
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(len(body)).encode()),
               (b"inference-header-content-length", str(len(head)).encode()), (b"x-request-id", b"first"),
               (b"x-request-id", b"second"), (b"content-type", b"text/plain")]

    async def go() -> list[dict[str, Any]]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await queue.put({"type": "lifespan.startup"})

        async def nothing(message: Any) -> None:
            pass

        life = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, queue.get,
                                       nothing))
        service = app.state.service
        while not service._loaded.is_set():
            await asyncio.sleep(0.01)
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        await app({"type": "http", "method": "POST", "path": "/v2/models/add/infer", "root_path": "",
                   "headers": headers, "query_string": b""}, receive, send)
        await queue.put({"type": "lifespan.shutdown"})
        await life
        return sent

    start, *bodies = asyncio.run(go())
    assert start["status"] == 200, bodies
    names = [k for k, _ in start["headers"]]
    for name in (b"x-request-id", b"x-tileship-release", b"x-tileship-kernel-revision", b"x-tileship-evidence"):
        assert names.count(name) == 1, (name, start["headers"])
    got = dict(start["headers"])
    assert got[b"x-request-id"] == b"first" and got[b"x-tileship-release"] == cpu_release_build.release_id.encode()
    out = bytes(bodies[0]["body"])[int(got[b"inference-header-content-length"]):]
    assert np.array_equal(np.frombuffer(out, dtype=np.float32), a + a)


def test_answered_requests_count_and_time_through_kept_label_children():
    """``ServeMetrics.answered``: the 200 counter and the latency histogram of (model, version, path)
    move on every call, also after its kept children were forgotten."""
    from tileship.serve import metrics as m

    sm = m.ServeMetrics(lambda: 0.0)
    for _ in range(3):
        sm.answered("add", "r1", "kernel", 0.0002)
    sm._answered.clear()
    sm.answered("add", "r1", "kernel", 0.0002)
    sm.answered("add", "r1", "reference", 0.004)
    text = sm.render().decode()
    assert 'tileship_requests_total{code="200",model="add",path="kernel",version="r1"} 4.0' in text
    assert 'tileship_request_seconds_count{model="add",path="reference",version="r1"} 1.0' in text
