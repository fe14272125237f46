"""gRPC's own bound on a message (protobuf's 2 GiB), whatever --max-output-mib and --max-body-mib allow.

The server here lowers that bound to 1 MiB (``ServeConfig.grpc_max_message_bytes``) so the refusals can be
seen without 2 GiB tensors; the output limit stays at its 1 GiB default, above the bound, as a server run with
``--max-output-mib 4096`` would be."""

from __future__ import annotations

import io
import json
import queue
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.utils.shared_memory as shm
from test_serve import metric, serving
from test_serve_grpc_hostile import _ab
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer, ServeConfig, grpc_codec
from tileship.serve.validate import BadRequest, RequestLimits

MOST = 1 << 20


@pytest.fixture(scope="module")
def one_mib(cpu_release_build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """A server of the CPU release whose gRPC messages are at most 1 MiB (outputs up to 1 GiB allowed)."""
    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path_factory.mktemp("diag"),
                      log_stream=io.StringIO(), grpc_max_message_bytes=MOST)
    with serving(cfg) as srv:
        yield srv


def test_an_answer_past_one_grpc_message_is_refused_before_it_runs(one_mib):
    """An answer that --max-output-mib allows but one gRPC message cannot carry is RESOURCE_EXHAUSTED naming its
    size and gRPC's bound, before the call runs, on ModelInfer and on a stream (which goes on); the server keeps
    serving. It used to run the call and then fail to send (protobuf refuses a message over 2 GiB)."""
    big = 270_000  # inputs of 2 x 1.08 MB would be refused on receipt: sent through shared memory below
    tag = uuid.uuid4().hex[:12]
    h = shm.create_shared_memory_region(f"r_{tag}", f"/tileship_test_{tag}", 12 * big)
    shm.set_shared_memory_region(h, [np.arange(big, dtype=np.float32), np.ones(big, dtype=np.float32)])
    c = tg.InferenceServerClient(one_mib.grpc_url)
    try:
        c.register_system_shared_memory("abc", f"/tileship_test_{tag}", 12 * big)
        inputs = [tg.InferInput("A", [big], "FP32"), tg.InferInput("B", [big], "FP32")]
        inputs[0].set_shared_memory("abc", 4 * big)
        inputs[1].set_shared_memory("abc", 4 * big, offset=4 * big)
        with pytest.raises(InferenceServerException) as e:
            c.infer("add", inputs)
        msg = e.value.message()
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", msg
        assert f"C={4 * big}" in msg and f"at most {MOST} bytes" in msg and "gRPC" in msg, msg
        # the same call with its output written to shared memory carries no tensor: answered
        out = tg.InferRequestedOutput("C")
        out.set_shared_memory("abc", 4 * big, offset=8 * big)
        c.infer("add", inputs, outputs=[out])
        got = shm.get_contents_as_numpy(h, np.float32, [3 * big])[2 * big:]
        assert got[:3].tolist() == [1.0, 2.0, 3.0] and got.shape == (big,)
        # on a stream: an error message for that request, and the next one answered
        got_q: queue.Queue = queue.Queue()
        c.start_stream(callback=lambda result, error: got_q.put((result, error)))
        c.async_stream_infer("add", inputs, request_id="big")
        c.async_stream_infer("add", _ab(3), request_id="small")
        (r1, e1), (r2, e2) = got_q.get(timeout=30), got_q.get(timeout=30)
        c.stop_stream()
        assert r1 is None and f"at most {MOST} bytes" in e1.message(), (r1, e1)
        assert e2 is None and r2.as_numpy("C").tolist() == [0.0, 2.0, 4.0]
        assert c.infer("add", _ab(3)).as_numpy("C").tolist() == [0.0, 2.0, 4.0]  # still serving
    finally:
        c.unregister_system_shared_memory()
        c.close()
        shm.destroy_shared_memory_region(h)


def _grpc_refusals(srv: BackgroundServer) -> float:
    return metric(httpx.get(srv.url + "/metrics", timeout=10).text, "tileship_rejected_total",
                  reason="grpc_message_too_large")


def test_a_request_past_one_grpc_message_is_refused_named_and_counted(one_mib):
    """A request over gRPC's bound (under --max-body-mib) is RESOURCE_EXHAUSTED naming its size, the bound and what
    to do, counted as ``tileship_rejected_total{reason="grpc_message_too_large"}``, on ModelInfer and on a stream
    (which goes on); the server answers the next request. It used to be grpc's own refusal on receipt ("Received
    message larger than max"), before any handler: counted nowhere, and a stream ended by it."""
    c = tg.InferenceServerClient(one_mib.grpc_url)
    try:
        before = _grpc_refusals(one_mib)
        with pytest.raises(InferenceServerException) as e:
            c.infer("add", _ab(200_000))  # 1.6 MB of inputs: past the 1 MiB bound, within grpc's backstop (2x)
        msg = e.value.message()
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", msg
        assert "inference.ModelInferRequest of 16000" in msg and f"gRPC's message limit of {MOST} bytes" in msg, msg
        assert "--max-body-mib" in msg and "shared memory" in msg, msg
        assert _grpc_refusals(one_mib) == before + 1
        assert c.infer("add", _ab(3)).as_numpy("C").tolist() == [0.0, 2.0, 4.0]
        got_q: queue.Queue = queue.Queue()
        c.start_stream(callback=lambda result, error: got_q.put((result, error)))
        c.async_stream_infer("add", _ab(200_000), request_id="big")
        c.async_stream_infer("add", _ab(3), request_id="small")
        (r1, e1), (r2, e2) = got_q.get(timeout=30), got_q.get(timeout=30)
        c.stop_stream()
        assert r1 is None and f"gRPC's message limit of {MOST} bytes" in e1.message(), (r1, e1)
        assert e2 is None and r2.as_numpy("C").tolist() == [0.0, 2.0, 4.0]
        assert _grpc_refusals(one_mib) == before + 2
    finally:
        c.close()


def _events(srv: BackgroundServer, name: str) -> list[dict]:
    stream = srv.service.config.log_stream
    assert isinstance(stream, io.StringIO)
    return [r for r in map(json.loads, stream.getvalue().splitlines()) if r.get("event") == name]


def test_the_start_log_warns_that_grpc_stays_capped_whatever_the_http_limits_say(one_mib):
    """--max-body-mib 64 and --max-output-mib 1024 both pass this server's gRPC bound: the server starts (REST
    honours them) and its start log says, once, as a warning, that gRPC requests and answers stay capped at the
    bound. It used to say nothing."""
    (warned,) = _events(one_mib, "grpc_limits")
    assert warned["level"] == "warning" and warned["grpc_max_message_bytes"] == MOST, warned
    text = warned["message"]
    assert f"--max-body-mib ({64 << 20} bytes) and --max-output-mib ({1 << 30} bytes)" in text, text
    assert f"gRPC requests and answers are capped at {MOST} bytes" in text and "REST honours" in text, text


@pytest.mark.parametrize(("body", "output", "grpc_port", "past"), [
    (64 << 20, 1 << 30, 0, None),                          # the defaults: under 2 GiB
    (4096 << 20, 1 << 30, 0, "--max-body-mib (4294967296 bytes) passes"),
    (64 << 20, 3072 << 20, 0, "--max-output-mib (3221225472 bytes) passes"),
    (4096 << 20, 4096 << 20, None, None),                  # no gRPC: nothing to say
], ids=["defaults", "body-4096", "output-3072", "no-grpc"])
def test_grpc_capped_names_the_limits_past_grpcs(tmp_path, body, output, grpc_port, past):
    cfg = ServeConfig(source=tmp_path, max_body_bytes=body, limits=RequestLimits(max_output_bytes=output),
                      grpc_port=grpc_port)
    text = cfg.grpc_capped()
    assert (text is None) if past is None else (past in text and "capped at 2147483647 bytes" in text), text
    assert cfg.grpc_max_request_bytes == min(body, (1 << 31) - 1)


def test_the_encoder_refuses_a_response_past_its_bound():
    """An output whose size the declaration could not tell before the call: the encoder refuses it with a 413
    naming the output and the bound, never a response that then fails in serialization."""
    outs = [("Y", torch.zeros(1000, dtype=torch.float32), True)]
    resp = grpc_codec.encode(model="m", version="1", request_id="r", parameters={}, outputs=outs, max_bytes=MOST)
    assert len(resp.raw_output_contents[0]) == 4000
    with pytest.raises(BadRequest) as e:
        grpc_codec.encode(model="m", version="1", request_id="r", parameters={}, outputs=outs, max_bytes=66_000)
    assert e.value.status == 413 and "output Y alone 4000" in e.value.message and "at most 66000" in e.value.message
