"""Property tests of the request grammar against a real server on 127.0.0.1 (issue 15, item 4):
any bytes, and structurally valid but wrong requests, get a 4xx (or a 200), never a 5xx; after
the run the metrics add up, nothing is in flight, nothing compiled, and the server is live and
ready. ``TILESHIP_FUZZ_EXAMPLES`` sets the examples per property (CI: the default)."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.test_serve_limits import hostile_server, metric

from tileship.serve import BackgroundServer

EXAMPLES = int(os.environ.get("TILESHIP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SENT: collections.Counter[int] = collections.Counter()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("fuzz"), body_timeout_s=5.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


def send(http: httpx.Client, model: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    r = http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    SENT[r.status_code] += 1
    assert r.status_code < 500, (r.status_code, r.text[:1000], body[:300], headers)
    assert len(r.json().get("error", "")) < 1000
    return r


MODELS = st.sampled_from(["add", "outer", "nope"])
CTYPES = st.sampled_from([None, "application/json", "application/octet-stream", "text/plain",
                          "application/json; charset=x"])
ASCII = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=30)


def headers_of(ctype: str | None, hl: str | None) -> dict[str, str]:
    h = {}
    if ctype is not None:
        h["content-type"] = ctype
    if hl is not None:
        h["inference-header-content-length"] = hl
    return h


@FUZZ
@given(model=MODELS, body=st.binary(max_size=2048), ctype=CTYPES,
       hl=st.none() | ASCII | st.integers(-10, 5000).map(str))
def test_any_bytes_get_a_4xx_never_a_5xx(http, model, body, ctype, hl):
    send(http, model, body, headers_of(ctype, hl))


NUMBER = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=False, allow_infinity=False), st.booleans())
JUNK: st.SearchStrategy[Any] = st.recursive(
    st.none() | NUMBER | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)
DIM = st.one_of(st.integers(-3, 8), st.integers(-(2 ** 80), 2 ** 80), st.sampled_from([2 ** 31, 2 ** 40, 2 ** 63]))
SHAPE = st.one_of(st.lists(DIM, max_size=10), JUNK)
DATA = st.one_of(st.lists(NUMBER, max_size=20), st.lists(st.lists(NUMBER, max_size=4), max_size=5), JUNK)
DTYPE = st.sampled_from(["FP32", "FP16", "BF16", "FP64", "INT32", "INT64", "UINT8", "BOOL", "BYTES", "fp32", ""])
NAME = st.sampled_from(["X", "Y", "W", "Z", "", "x" * 300])


@st.composite
def tensor(draw: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"name": draw(NAME), "datatype": draw(DTYPE), "shape": draw(SHAPE)}
    if draw(st.booleans()):
        t["data"] = draw(DATA)
    else:
        t["parameters"] = {"binary_data_size": draw(st.integers(-4, 64) | st.integers(2 ** 60, 2 ** 70) | JUNK)}
    if draw(st.integers(0, 9)) == 0:
        t[draw(st.text(max_size=5))] = draw(JUNK)
    return t


PARAMS = st.fixed_dictionaries({}, optional={"binary_data_output": st.booleans() | JUNK,
                                             "allow_nonfinite": st.booleans() | JUNK, "shared_memory_region": JUNK})
OUTPUTS = st.lists(st.fixed_dictionaries({"name": NAME}, optional={"parameters": st.fixed_dictionaries(
    {}, optional={"binary_data": st.booleans() | JUNK})}), max_size=3) | JUNK


@st.composite
def request_doc(draw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": draw(st.lists(tensor(), max_size=3) | JUNK)}
    if draw(st.booleans()):
        doc["parameters"] = draw(PARAMS)
    if draw(st.booleans()):
        doc["outputs"] = draw(OUTPUTS)
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=10) | JUNK)
    return doc


@FUZZ
@given(model=MODELS, doc=request_doc(), ctype=st.sampled_from([None, "application/json"]),
       nonfinite=st.sampled_from([None, "NaN", "Infinity", "-Infinity"]))
def test_valid_but_wrong_json_requests_get_a_4xx_never_a_5xx(http, model, doc, ctype, nonfinite):
    body = json.dumps(doc).encode()
    if nonfinite is not None:  # a bare token where a number stood
        body = body.replace(b"0.0", nonfinite.encode(), 1)
    send(http, model, body, headers_of(ctype, None))


@FUZZ
@given(model=MODELS, doc=request_doc(), blob=st.binary(max_size=256), lie=st.integers(-40, 40))
def test_binary_requests_with_lying_lengths_get_a_4xx_never_a_5xx(http, model, doc, blob, lie):
    head = json.dumps(doc).encode()
    send(http, model, head + blob, headers_of("application/octet-stream", str(len(head) + lie)))


def test_after_fuzzing_the_metrics_add_up_and_the_server_is_live_and_ready(server, http):
    assert sum(SENT.values()) >= 3 * min(EXAMPLES, 10), SENT
    text = http.get("/metrics").text
    for code, n in SENT.items():
        assert metric(text, "tileship_requests_total", code=str(code)) == n, (code, n, SENT)
    assert metric(text, "tileship_requests_total") == sum(SENT.values())
    assert metric(text, "tileship_requests_total", code="500") == 0
    assert metric(text, "tileship_inflight_requests") == 0 and server.service.slots.inflight == 0
    assert metric(text, "tileship_serve_compile_attempts") == 0
    assert http.get("/v2/health/live").status_code == 200 and http.get("/v2/health/ready").status_code == 200
    print(f"fuzz: {sum(SENT.values())} requests sent, by status {dict(sorted(SENT.items()))}")
