"""Inputs of several datatypes and scalars (``tests/calls_ops.py``: float32 and bool ScalarArgs, an int32 tensor, an
int32 scalar) sent as JSON, raw bytes and typed gRPC contents, against real servers on 127.0.0.1 in process and with
``--workers 1``: both answer alike, and a value the input's datatype cannot hold is a 400 naming it. Each test here
failed on the code before its fix (see the commit that added it)."""

from __future__ import annotations

import io
import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from test_serve_workers import wait_workers

from tileship.serve import BackgroundServer, ServeConfig

TESTS = Path(__file__).parent


@pytest.fixture(scope="module", params=["in_process", "workers"])
def server(request, calls_release_build, tmp_path_factory) -> Iterator[BackgroundServer]:
    """A server of the calls release: in process, or with one worker process (which imports ``calls_ops``)."""
    workers = 1 if request.param == "workers" else 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        srv = BackgroundServer(ServeConfig(source=calls_release_build.path, grpc_port=0, workers=workers,
                                           diagnostics_dir=tmp_path_factory.mktemp("diag"),
                                           log_stream=io.StringIO())).start()
        try:
            if workers:
                wait_workers(srv)
            else:
                assert srv.wait_ready(), srv.service.holder.readiness()[1]
            yield srv
        finally:
            srv.stop()


def _post(srv: BackgroundServer, model: str, inputs: list[dict[str, Any]], blob: bytes = b"",
          **extra: Any) -> httpx.Response:
    head = json.dumps({"inputs": inputs, **extra}).encode()
    headers = {"inference-header-content-length": str(len(head))} if blob else {"content-type": "application/json"}
    return httpx.post(f"{srv.url}/v2/models/{model}/infer", content=head + blob, headers=headers, timeout=60)


def _binary_output(r: httpx.Response, dtype: Any) -> np.ndarray:
    assert r.status_code == 200, r.text
    hl = int(r.headers["inference-header-content-length"])
    return np.frombuffer(r.content[hl:], dtype)


A32 = list(range(32))


@pytest.mark.parametrize("s", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_float_scalar_is_passed_as_it_is(server, s):
    """``scale``'s float32 ScalarArg ``s`` holding NaN or +-Infinity (raw bytes, or JSON with allow_nonfinite, or gRPC
    contents) is multiplied in as sent. Through a worker it used to reach the operator as None: the call frame is
    JSON, which writes NaN and Infinity as null, so the worker answered 400 `pass a Python number, got NoneType`
    where the in-process server answered 200."""
    with np.errstate(invalid="ignore"):  # 0 x Infinity is NaN
        want = np.arange(32, dtype=np.float32) * np.float32(s)
    a = {"name": "A", "shape": [32], "datatype": "FP32", "data": A32}
    flag = {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [True]}
    out = [{"name": "B", "parameters": {"binary_data": True}}]
    raw = _post(server, "scale", [a, {"name": "s", "shape": [1], "datatype": "FP32", "parameters": {
        "binary_data_size": 4}}, flag], struct.pack("<f", s), outputs=out)
    np.testing.assert_array_equal(_binary_output(raw, np.float32), want)
    text = json.dumps({"inputs": [a, {"name": "s", "shape": [], "datatype": "FP32", "data": [s]}, flag],
                       "outputs": out, "parameters": {"allow_nonfinite": True}})
    js = httpx.post(f"{server.url}/v2/models/scale/infer", content=text, timeout=60)
    np.testing.assert_array_equal(_binary_output(js, np.float32), want)
    c = tg.InferenceServerClient(server.grpc_url)
    try:
        ins = [tg.InferInput("A", [32], "FP32"), tg.InferInput("s", [1], "FP32"), tg.InferInput("flag", [1], "BOOL")]
        ins[0].set_data_from_numpy(np.arange(32, dtype=np.float32))
        ins[1].set_data_from_numpy(np.array([s], dtype=np.float32))
        ins[2].set_data_from_numpy(np.array([True]))
        np.testing.assert_array_equal(c.infer("scale", ins).as_numpy("B"), want)
    finally:
        c.close()


@pytest.mark.parametrize("model,inputs,words", [
    ("half", [{"name": "X", "shape": [48], "datatype": "INT32", "data": [0.5] * 48}],
     "input X: 'data' does not hold INT32 values (0.5 is not a whole number)"),
    ("mul_add", [{"name": "A", "shape": [32], "datatype": "FP32", "data": A32},
                 {"name": "s", "shape": [1], "datatype": "FP32", "data": [0.5]},
                 {"name": "n", "shape": [1], "datatype": "INT32", "data": [1.5]}],
     "input n: 'data' does not hold INT32 values (1.5 is not a whole number)"),
    ("scale", [{"name": "A", "shape": [32], "datatype": "FP32", "data": A32},
               {"name": "s", "shape": [1], "datatype": "FP32", "data": [2.0]},
               {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [2]}],
     "input flag: 'data' does not hold BOOL values (2 is neither true nor false)"),
    ("scale", [{"name": "A", "shape": [32], "datatype": "FP32", "data": A32},
               {"name": "s", "shape": [1], "datatype": "FP32", "data": [2.0]},
               {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [0.5]}],
     "input flag: 'data' does not hold BOOL values (0.5 is neither true nor false)"),
], ids=["fraction-in-int32-tensor", "fraction-in-int32-scalar", "two-in-bool", "fraction-in-bool"])
def test_json_data_its_datatype_cannot_hold_is_a_400(server, model, inputs, words):
    """A JSON number an integer or BOOL input cannot hold as it is was converted anyway, by torch.tensor's rules: 0.5
    in an INT32 tensor became 0, the int32 scalar 1.5 became 1, the BOOL 2 (or 0.5) became true; each a 200 with an
    answer computed from other values than the client sent. Triton refuses such data too."""
    r = _post(server, model, inputs)
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_json_data_an_integer_or_bool_input_holds_exactly_is_served(server):
    """What such inputs do hold is still served: whole numbers written as floats (2.0), true/false and 0/1."""
    r = _post(server, "mul_add", [{"name": "A", "shape": [32], "datatype": "FP32", "data": A32},
                                  {"name": "s", "shape": [1], "datatype": "FP32", "data": [0.5]},
                                  {"name": "n", "shape": [1], "datatype": "INT32", "data": [3.0]}])
    assert r.status_code == 200, r.text
    assert [o["data"][:2] for o in r.json()["outputs"]] == [[0.0, 0.5], [3.0, 4.0]]
    r = _post(server, "half", [{"name": "X", "shape": [48], "datatype": "INT32", "data": [[4.0, -2] * 12] * 2}])
    assert r.status_code == 200 and r.json()["outputs"][0]["data"][:2] == [2.0, -1.0], r.text
    for flag, scale in ((1, 2.0), (0, 1.0), (True, 2.0), (False, 1.0), (1.0, 2.0)):
        r = _post(server, "scale", [{"name": "A", "shape": [32], "datatype": "FP32", "data": A32},
                                    {"name": "s", "shape": [1], "datatype": "FP32", "data": [2.0]},
                                    {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [flag]}])
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][:2] == [0.0, scale], (flag, r.text)


@pytest.fixture
def regions() -> Iterator[Any]:
    import shm_regions

    yield from shm_regions.regions("b")


def test_raw_bool_bytes_other_than_0_or_1_are_a_400_on_every_transport(server, regions):
    """``scale``'s BOOL ScalarArg ``flag`` as raw bytes: the binary extension, gRPC ``raw_input_contents`` and a
    system shared-memory region. A byte of 2 (or 255) was taken as true and served 200, an answer computed from
    another value than the client sent, where the same 2 in JSON is a 400 (``json_data``); now the same 400 /
    INVALID_ARGUMENT naming the input and the byte. 0 and 1 are still served."""
    import tritonclient.http as th
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    a = {"name": "A", "shape": [32], "datatype": "FP32", "data": A32}
    s = {"name": "s", "shape": [1], "datatype": "FP32", "data": [2.0]}
    out = [{"name": "B", "parameters": {"binary_data": True}}]
    raw_flag = {"name": "flag", "shape": [1], "datatype": "BOOL", "parameters": {"binary_data_size": 1}}
    for byte, want in ((0, 1.0), (1, 2.0)):
        r = _post(server, "scale", [a, s, raw_flag], bytes([byte]), outputs=out)
        assert _binary_output(r, np.float32)[1] == want, (byte, r.text)
    words = "input flag: its raw bytes do not hold BOOL values (byte 0 is {}, neither true (1) nor false (0))"
    for byte in (2, 255):
        r = _post(server, "scale", [a, s, raw_flag], bytes([byte]), outputs=out)
        assert r.status_code == 400 and words.format(byte) in r.json()["error"], r.text

    c = tg.InferenceServerClient(server.grpc_url)
    try:
        ins = [tg.InferInput("A", [32], "FP32"), tg.InferInput("s", [1], "FP32"), tg.InferInput("flag", [1], "BOOL")]
        ins[0].set_data_from_numpy(np.arange(32, dtype=np.float32))
        ins[1].set_data_from_numpy(np.array([2.0], dtype=np.float32))
        ins[2].set_data_from_numpy(np.array([2], dtype=np.uint8).view(np.bool_))  # raw_input_contents: b"\x02"
        with pytest.raises(InferenceServerException) as info:
            c.infer("scale", ins)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and words.format(2) in info.value.message(), \
            str(info.value)
    finally:
        c.close()

    h, region, key = regions.create(2)
    shm.set_shared_memory_region(h, [np.array([1, 7], dtype=np.uint8)])
    hc = th.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        hc.register_system_shared_memory(region, key, 2)
        for offset, status in ((0, 200), (1, 400)):
            flag = {"name": "flag", "shape": [1], "datatype": "BOOL", "parameters": {
                "shared_memory_region": region, "shared_memory_byte_size": 1, "shared_memory_offset": offset}}
            r = _post(server, "scale", [a, s, flag])
            assert r.status_code == status, r.text
            if status == 400:
                assert words.format(7) in r.json()["error"], r.text
        hc.unregister_system_shared_memory(region)
    finally:
        hc.close()


def test_a_raw_bool_tensor_bound_for_a_worker_is_checked_before_it_is_sent():
    """With ``--workers``, a raw input tensor goes to the worker as its bytes (``remote._arguments``: no tensor is
    made in the front end): a BOOL one is checked there, with the same words (``protocol.raw_bytes``)."""
    from tileship.serve import remote
    from tileship.serve.call_plan import CallPlan
    from tileship.serve.protocol import InputTensor
    from tileship.serve.validate import BadRequest

    def plan(data: bytes) -> CallPlan:
        mask = InputTensor("mask", "BOOL", (4,), raw=memoryview(bytearray(data)))
        return CallPlan([mask], "float32", {"M": 4}, True, [("Y", False)])

    (raw,) = remote._arguments(plan(b"\x00\x01\x01\x00"))
    assert bytes(raw.raw) == b"\x00\x01\x01\x00" and raw.dtype == "bool"
    with pytest.raises(BadRequest) as info:
        remote._arguments(plan(b"\x00\x01\x03\x00"))
    assert info.value.status == 400 and info.value.message == (
        "wrong dtype: input mask: its raw bytes do not hold BOOL values (byte 2 is 3, neither true (1) nor false (0))")
