"""The server's OpenAPI description (src/tileship/serve/openapi.json) against the server (issue 15,
item 8): every route the app registers is described and nothing else is, and schemathesis, reading
the description from ``GET /v2/tileship/openapi.json`` of a real server on 127.0.0.1, sends what
the schemas allow (and what they do not) to every operation: never a 5xx, responses whose status,
content type and body match the description; afterwards nothing is in flight, nothing compiled,
and the server is live and ready. ``TILESHIP_SCHEMA_EXAMPLES`` sets the examples per operation."""

from __future__ import annotations

import collections
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route
from test_serve import metric, serving

from tileship.serve import BackgroundServer, ServeConfig, openapi

EXAMPLES = int(os.environ.get("TILESHIP_SCHEMA_EXAMPLES", "30"))


def own_deadline(response: Any) -> bool:
    """A 504 the request asked for: its own ``parameters.timeout`` (a few us, as the fuzz sends) passed while it
    waited for the worker thread (docs/serving.md, "Request parameters")."""
    return response.status_code == 504 and "parameters.timeout" in response.text


def no_5xx(ctx: Any, response: Any, case: Any) -> bool | None:
    """``not_a_server_error``, except the documented 503 with which a model's readiness route says "not ready"
    (the fuzz may unload a served model: ``POST /v2/repository/models/add/unload`` is a valid request), and a 504
    past the request's own timeout (``own_deadline``)."""
    if (response.status_code == 503 and case.operation.path.endswith("/ready")) or own_deadline(response):
        return None
    return not_a_server_error(ctx, response, case)  # type: ignore[no-any-return]


CHECKS = [no_5xx, status_code_conformance, content_type_conformance, response_schema_conformance]
SENT: collections.Counter[tuple[str, int]] = collections.Counter()


@pytest.fixture(scope="module")
def server(cpu_release_build, tmp_path_factory) -> Iterator[BackgroundServer]:
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path_factory.mktemp("diag"),
                      log_stream=io.StringIO(), body_timeout_s=5.0)
    with serving(cfg) as srv:
        yield srv


def _registered(server: BackgroundServer) -> set[tuple[str, str]]:
    routes = server.app.app.routes  # RequestIds wraps the Starlette app
    return {(r.path, m) for r in routes if isinstance(r, Route) for m in r.methods or () if m != "HEAD"}


def test_every_registered_route_is_described_and_nothing_else(server):
    doc = json.loads(openapi.document())
    described = {(p, m.upper()) for p, ops in doc["paths"].items() for m in ops if m != "parameters"}
    registered = _registered(server)
    assert registered - described == set(), "routes missing from src/tileship/serve/openapi.json"
    assert described - registered == set(), "openapi.json describes routes the app does not register"
    assert len(registered) >= 25, registered


def test_the_served_description_is_the_packaged_file(server):
    r = httpx.get(server.url + openapi.PATH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content == openapi.document()
    assert r.json()["openapi"].startswith("3.")


# the operations, from the packaged file (the test above checks the server serves the same bytes);
# schemathesis' own pytest plugin (``from_fixture``) does not run under pytest 9, so each operation is a
# hypothesis test over ``APIOperation.as_strategy``, in both modes: data the schema allows, and data it does not
# a body the description refuses may be refused with any 4xx (413 for a shape past the element limit)
CONFIG = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": ["4XX"]}}})
SCHEMA = schemathesis.openapi.from_dict(json.loads(openapi.document()), config=CONFIG)
OPERATIONS = {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in SCHEMA.get_all_operations())}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


# negative data only where there is a body to break (any string is a valid path parameter); inference
# also on a model the release serves, so that generated bodies reach the checks against its declaration
_BODY = [label for label in sorted(OPERATIONS) if OPERATIONS[label].body]
_MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
RUNS = [(label, GenerationMode.POSITIVE, None) for label in sorted(OPERATIONS)] + \
       [(label, GenerationMode.NEGATIVE, None) for label in _BODY] + \
       [("POST /v2/models/{name}/infer", mode, "add") for mode in _MODES]


@pytest.mark.parametrize("label,mode,model", RUNS,
                         ids=[f"{label}-{mode}" + (f"-{model}" if model else "") for label, mode, model in RUNS])
def test_schemathesis_finds_no_5xx_and_responses_match_the_description(server, label, mode, model):
    # a body the description refuses must be refused by the server too (a 4xx)
    checks = CHECKS + [negative_data_rejection] if mode == GenerationMode.NEGATIVE else CHECKS
    pinned = {"path_parameters": {"name": model}} if model else {}
    if model:  # serve it (again): an earlier run may have unloaded it
        assert httpx.post(f"{server.url}/v2/repository/models/{model}/load").status_code == 200

    @FUZZ
    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode, **pinned))
    def run(case: Any) -> None:
        response = case.call_and_validate(base_url=server.url, checks=checks, timeout=30)
        SENT[(label, -504 if own_deadline(response) else response.status_code)] += 1  # -504: asked for

    run()


def _examples(op: Any) -> list[Any]:
    """The cases of the examples the description gives for ``op`` (one each)."""
    cases: list[Any] = []
    for strategy in SCHEMA.get_strategies_from_examples(op):
        @settings(max_examples=1, database=None, derandomize=True)
        @given(case=strategy)
        def grab(case: Any) -> None:
            cases.append(case)

        grab()
    return cases[:1] if cases else []


def test_the_documented_examples_are_answered_with_a_2xx(server):
    """The examples in the description (model ``add``, an inference body, a logging change) work as written."""
    answered = {}
    assert httpx.post(server.url + "/v2/repository/models/add/load").status_code == 200  # the fuzz may have unloaded it
    for label, op in sorted(OPERATIONS.items()):
        for case in _examples(op):
            if case.headers:  # the example body is JSON: no binary-extension header
                case.headers.pop("Inference-Header-Content-Length", None)
            r = case.call(base_url=server.url, timeout=30)
            case.validate_response(r, checks=CHECKS)
            SENT[(label, r.status_code)] += 1
            answered[label] = r
    assert {"POST /v2/models/{name}/infer", "GET /v2/models/{name}", "POST /v2/logging",
            "POST /v2/repository/models/{name}/unload"} <= set(answered), sorted(answered)
    for label, r in answered.items():
        if "{version}" not in label:  # the release id is no example: another version is a 404
            assert r.status_code < 300, (label, r.status_code, r.text[:300])
    assert answered["POST /v2/models/{name}/infer"].json()["outputs"][0]["data"] == [6.0, 8.0, 10.0, 12.0]
    # load sorts before unload: serve add again, as the other tests expect
    assert httpx.post(server.url + "/v2/repository/models/add/load").status_code == 200
    assert httpx.get(server.url + "/v2/models/add/ready").status_code == 200


def test_after_the_schema_fuzz_the_server_is_live_ready_and_idle(server):
    assert sum(SENT.values()) >= 50, SENT
    assert not [k for k in SENT if k[1] >= 500 and not (k[1] == 503 and k[0].endswith("/ready"))], SENT
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "tileship_requests_total", code="500") == 0
    assert metric(text, "tileship_inflight_requests") == 0 and server.service.slots.inflight == 0
    assert metric(text, "tileship_serve_compile_attempts") == 0
    assert httpx.get(server.url + "/v2/health/live").status_code == 200
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200
    by_status = collections.Counter(code for _, code in SENT.elements())
    assert len({label for label, _ in SENT}) == len(OPERATIONS), set(OPERATIONS) - {label for label, _ in SENT}
    print(f"schema fuzz: {sum(SENT.values())} requests, by status {dict(sorted(by_status.items()))}")
