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
