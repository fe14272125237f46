"""Real clients' public methods against ``tileship serve`` where the other serve tests leave gaps:
``tritonclient.http.aio`` (aiohttp), ``tritonclient.grpc`` streaming, ``tritonclient.grpc.aio``. One server
of the hostile release (references only, REST and gRPC) on 127.0.0.1 for the module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha
from tests.test_serve_limits import hostile_server
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("clients"), grpc_port=0) as srv:
        yield srv


X = np.arange(4, dtype=np.float32)


def _http_inputs(binary: bool) -> list[th.InferInput]:
    out = []
    for name in ("X", "Y"):
        i = th.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(X, binary_data=binary)
        out.append(i)
    return out


def test_aio_http_json_request_is_served(server: BackgroundServer) -> None:
    """tritonclient.http.aio posts a JSON-only body as bytes, which aiohttp types application/octet-stream:
    Triton reads it regardless, so the server must too (it answered 415)."""
    async def go() -> tuple[np.ndarray, str | None]:
        c = tha.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            res = await c.infer("add", _http_inputs(False), request_id="aio-json",
                                outputs=[th.InferRequestedOutput("Z", binary_data=False)])
            return res.as_numpy("Z"), res.get_response().get("id")
        finally:
            await c.close()

    z, rid = asyncio.run(go())
    assert z.tolist() == (2 * X).tolist() and rid == "aio-json"


def test_a_json_body_of_another_type_is_still_415(server: BackgroundServer) -> None:
    import httpx

    body = b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1]}]}'
    r = httpx.post(server.url + "/v2/models/add/infer", content=body, headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as e:  # and the aio client sees the server's message
        asyncio.run(_aio_infer(server, "nope"))
    assert e.value.status() == "404" and "unknown model 'nope'" in str(e.value.message())


async def _aio_infer(server: BackgroundServer, model: str) -> None:
    c = tha.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        await c.infer(model, _http_inputs(False))
    finally:
        await c.close()

