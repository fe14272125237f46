"""What Triton clients send and expect where tileship answered otherwise: an unloaded model's metadata, config and
inference; the request parameters ``timeout`` and ``priority``; the trace extension. Real clients
(``tritonclient.http``, ``tritonclient.grpc`` and its ``aio``) against one server of the hostile release (references
only, REST and gRPC, one worker thread) on 127.0.0.1; each test failed on the code before its fix."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
from tests.test_serve_limits import hostile_server
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer

#: holds the ``slow`` model's calls while clear (each waits at most 10 s), so that the one worker thread is busy
GATE = threading.Event()
GATE.set()


def _slow(x: torch.Tensor) -> torch.Tensor:
    GATE.wait(10)
    return x + 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("protocol"), extra={"slow": _slow}, grpc_port=0) as srv:
        yield srv
    GATE.set()


X = np.arange(4, dtype=np.float32)


def _inputs(mod: Any, model: str = "add") -> list[Any]:
    out = []
    for name in ("X", "Y") if model == "add" else ("X",):
        i = mod.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(X)
        out.append(i)
    return out


def _error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


# -- an unloaded model --------------------------------------------------------------------------------------------

def test_an_unloaded_model_answers_as_triton_over_rest_and_grpc(server: BackgroundServer) -> None:
    """After ``unload``, Triton has no available version of the model: metadata, config and inference are
    NOT_FOUND (404), and UNAVAILABLE (503) when the request names the version; ready is false. Metadata and
    config answered 200 for the unloaded model, inference 400 over REST and UNAVAILABLE over gRPC."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    h.unload_model("add")
    try:
        for what, call in (("metadata", lambda: h.get_model_metadata("add")),
                           ("config", lambda: h.get_model_config("add")),
                           ("infer", lambda: h.infer("add", _inputs(th)))):
            e = _error(call)
            assert (e.status(), "model add is unloaded" in e.message()) == ("404", True), (what, e)
            assert "/v2/repository/models/add/load" in e.message(), (what, e)
        e = _error(lambda: h.get_model_metadata("add", model_version="hostile"))
        assert e.status() == "503" and "version hostile of model add is unloaded" in e.message(), e
        e = _error(lambda: h.infer("add", _inputs(th), model_version="hostile"))
        assert e.status() == "503" and "unloaded" in e.message(), e
        assert not h.is_model_ready("add") and h.is_model_ready("outer")
        for what, call in (("metadata", lambda: g.get_model_metadata("add")),
                           ("config", lambda: g.get_model_config("add")),
                           ("infer", lambda: g.infer("add", _inputs(tg)))):
            e = _error(call)
            assert (e.status(), "model add is unloaded" in e.message()) == ("StatusCode.NOT_FOUND", True), (what, e)
            assert "RepositoryModelLoad" in e.message(), (what, e)
        e = _error(lambda: g.get_model_config("add", model_version="hostile"))
        assert e.status() == "StatusCode.UNAVAILABLE" and "unloaded" in e.message(), e
        assert not g.is_model_ready("add") and g.is_model_ready("outer")

        async def aio() -> str:
            c = tga.InferenceServerClient(server.grpc_url)
            try:
                await c.get_model_metadata("add")
                return "answered"
            except InferenceServerException as exc:
                return f"{exc.status()} {exc.message()}"
            finally:
                await c.close()

        assert asyncio.run(aio()).startswith("StatusCode.NOT_FOUND model add is unloaded")
    finally:
        h.load_model("add")
    assert h.get_model_metadata("add")["name"] == "add" and g.get_model_config("add").config.name == "add"
    assert h.infer("add", _inputs(th)).as_numpy("Z").tolist() == (2 * X).tolist()
    h.close()
    g.close()
