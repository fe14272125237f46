"""Triton's logging extension of `tileship serve` (issue 15, item 6): GET/POST /v2/logging and the
gRPC LogSettings RPC, checked with tritonclient against one server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as tg
from test_serve import client, log_lines
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer
from tileship.serve.log_settings import MAX_VERBOSE

DEFAULT = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
           "log_format": "json"}
GOOD = {"inputs": [{"name": "A", "shape": [2], "datatype": "FP32", "data": [1, 2]},
                   {"name": "B", "shape": [2], "datatype": "FP32", "data": [3, 4]}]}
BAD = {"inputs": [{"name": "A", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}


@pytest.fixture(scope="module")
def server(grpc_server: BackgroundServer) -> BackgroundServer:
    return grpc_server


@pytest.fixture
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c
        c.post("/v2/logging", json=DEFAULT)  # every test starts from the defaults


def _lines_after(server: BackgroundServer, mark: int) -> list[dict[str, Any]]:
    return log_lines(server.service.config.log_stream)[mark:]  # type: ignore[arg-type]


def _mark(server: BackgroundServer) -> int:
    return len(log_lines(server.service.config.log_stream))  # type: ignore[arg-type]


def test_defaults_and_the_claimed_extension(server, http):
    c = client(server)
    try:
        assert "logging" in c.get_server_metadata()["extensions"]
        assert c.get_log_settings() == DEFAULT
    finally:
        c.close()
    assert http.get("/v2/logging").json() == DEFAULT


def test_log_info_and_log_warning_switch_those_lines_off_and_on(server, http):
    mark = _mark(server)
    assert http.post("/v2/logging", json={"log_info": False}).json() == {**DEFAULT, "log_info": False}
    assert http.post("/v2/models/add/infer", json=GOOD).status_code == 200
    assert http.post("/v2/models/add/infer", json=BAD).status_code == 400
    lines = _lines_after(server, mark)
    assert lines[0]["event"] == "log_settings" and lines[0]["log_info"] is False, lines[:1]  # the switch is written
    infers = [ln for ln in lines if ln["event"] == "infer"]
    assert [ln["level"] for ln in infers] == ["warning"], infers  # the 400, not the 200
    mark = _mark(server)
    http.post("/v2/logging", json={"log_warning": False})
    assert http.post("/v2/models/add/infer", json=BAD).status_code == 400
    assert not [ln for ln in _lines_after(server, mark) if ln["event"] == "infer"]
    mark = _mark(server)
    assert http.post("/v2/logging", json={"log_info": True, "log_warning": True}).json() == DEFAULT
    assert http.post("/v2/models/add/infer", json=GOOD).status_code == 200
    assert [ln["level"] for ln in _lines_after(server, mark) if ln["event"] == "infer"] == ["info"]


def test_verbose_level_lets_debug_lines_through(server, http):
    log = server.service.log
    mark = _mark(server)
    log.event("probe", "debug", n=0)
    assert http.post("/v2/logging", json={"log_verbose_level": 2}).json()["log_verbose_level"] == 2
    log.event("probe", "debug", n=1)
    http.post("/v2/logging", json={"log_verbose_level": 0})
    log.event("probe", "debug", n=2)
    assert [ln["n"] for ln in _lines_after(server, mark) if ln["event"] == "probe"] == [1]


def test_posting_back_what_was_read_changes_nothing(server, http):
    mark = _mark(server)
    now = http.get("/v2/logging").json()
    assert http.post("/v2/logging", json=now).json() == now
    assert http.post("/v2/logging", json={"log_format": "default", "log_file": ""}).json() == DEFAULT
    assert not [ln for ln in _lines_after(server, mark) if ln["event"] == "log_settings"]


@pytest.mark.parametrize("body,words", [
    (b'{"log_rotate": true}', "unknown logging setting 'log_rotate'"),
    (b'{"log_info": "yes"}', "log_info must be true or false, not 'yes'"),
    (b'{"log_error": 1}', "log_error must be true or false"),
    (b'{"log_warning": null}', "log_warning must be true or false, not None"),
    (b'{"log_verbose_level": true}', "log_verbose_level must be an integer from 0"),
    (b'{"log_verbose_level": -1}', "not -1"),
    (b'{"log_verbose_level": 1.5}', "not 1.5"),
    (f'{{"log_verbose_level": {MAX_VERBOSE + 1}}}'.encode(), f"from 0 to {MAX_VERBOSE}"),
    (b'{"log_verbose_level": ' + b"9" * 5000 + b"}", "malformed JSON"),
    (b'{"log_file": "/tmp/tileship.log"}', "log_file '/tmp/tileship.log' is not supported"),
    (b'{"log_format": "ISO8601"}', "log_format 'ISO8601' is not supported"),
    (b'{"log_info": false, "log_format": "ISO8601"}', "log_format"),  # checked whole: log_info stays on
    (b"[1, 2]", "must be a JSON object"),
    (b"{", "malformed JSON"),
    (b"", "malformed JSON"),
    (b'{"log_info": false, "log_info": true}', "key 'log_info' appears twice in one object"),
    (b'{"log_verbose_level": 1, "log_error": false, "log_verbose_level": 0}', "key 'log_verbose_level' appears twice"),
], ids=["unknown", "str-bool", "int-bool", "null", "bool-int", "negative", "float", "past-uint32", "huge-int",
        "file", "format", "half-good", "array", "truncated", "empty", "key-twice", "key-twice-apart"])
def test_bad_settings_are_a_400_naming_the_field_and_change_nothing(server, http, body, words):
    r = http.post("/v2/logging", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"], r.json()
    assert len(r.json()["error"]) < 400
    assert http.get("/v2/logging").json() == DEFAULT


def test_grpc_log_settings_read_change_and_refuse(server, http):
    gc = tg.InferenceServerClient(server.grpc_url)
    try:
        assert gc.get_log_settings(as_json=True)["settings"] == {
            "log_file": {"string_param": ""}, "log_info": {"bool_param": True}, "log_warning": {"bool_param": True},
            "log_error": {"bool_param": True}, "log_verbose_level": {"uint32_param": 0},
            "log_format": {"string_param": "json"}}
        gc.update_log_settings({"log_error": False, "log_verbose_level": 3})
        assert http.get("/v2/logging").json() == {**DEFAULT, "log_error": False, "log_verbose_level": 3}  # one state
        with pytest.raises(InferenceServerException) as e:
            gc.update_log_settings({"log_file": "/tmp/x.log"})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "log_file" in e.value.message(), e.value
        with pytest.raises(InferenceServerException) as e:
            gc.update_log_settings({"log_info": None})  # a value with no type set
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "log_info must be" in e.value.message()
        # a string where a boolean goes: tritonclient refuses to send it
        with grpc.insecure_channel(server.grpc_url) as ch:
            req = pb.LogSettingsRequest()
            req.settings["log_warning"].string_param = "no"
            with pytest.raises(grpc.RpcError) as r:
                pb_grpc.GRPCInferenceServiceStub(ch).LogSettings(req)
            assert r.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "log_warning must be" in r.value.details()
        assert http.get("/v2/logging").json() == {**DEFAULT, "log_error": False, "log_verbose_level": 3}
    finally:
        gc.close()


def test_log_lines_are_one_json_object_each_whatever_the_fields_hold():
    import json as stdjson
    import math
    from pathlib import Path

    from tileship.serve.jsonlog import line_of

    for record in ({"event": "infer", "ms": 0.25, "path": Path("/x"), 3: "int key"},
                   {"event": "hostile", "shape": [2**70, -(2**80)]},  # past orjson's 64-bit integers
                   {"event": "odd", "value": math.nan}):
        line = line_of(record)
        assert line.endswith("\n") and line.count("\n") == 1
        back = stdjson.loads(line)
        assert back["event"] == record["event"]
    assert stdjson.loads(line_of({"shape": [2**70]}))["shape"] == [2**70]
    assert stdjson.loads(line_of({"p": Path("/x"), 3: 1})) == {"p": "/x", "3": 1}


def test_an_infer_line_says_where_the_call_spent_its_time(server, http):
    mark = _mark(server)
    assert http.post("/v2/models/add/infer", json=GOOD).status_code == 200
    line = next(x for x in _lines_after(server, mark) if x.get("event") == "infer")
    spans = line["spans"]
    assert set(spans) == {"args_ms", "call_ms", "sync_ms", "host_ms", "encode_ms"}, spans
    assert all(isinstance(v, float) and v >= 0 for v in spans.values()), spans
    assert sum(spans.values()) <= line["run_ms"], (spans, line["run_ms"])  # parts of the time on the thread
    assert line["on"] in ("thread", "inline")  # in process: a request thread, or the loop once a kernel was quick


def test_a_long_request_id_costs_the_log_a_bounded_line(server, http):
    """The request ``id`` is echoed in the answer whole, but the infer log line carries its head only: a
    client sending megabyte ids must not write megabytes of log per request."""
    from tileship.serve.jsonlog import FIELD_CHARS

    long_id = "x" * (2 << 20)
    mark = _mark(server)
    r = http.post("/v2/models/add/infer", json={**GOOD, "id": long_id})
    assert r.status_code == 200 and r.json()["id"] == long_id
    infers = [ln for ln in _lines_after(server, mark) if ln["event"] == "infer"]
    assert len(infers) == 1, infers
    assert infers[0]["id"] == f"{'x' * FIELD_CHARS}...(+{len(long_id) - FIELD_CHARS} chars)"
    assert http.post("/v2/models/add/infer", json={**GOOD, "id": "short"}).status_code == 200
    assert [ln["id"] for ln in _lines_after(server, mark) if ln["event"] == "infer"][-1] == "short"
