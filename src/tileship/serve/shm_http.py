"""REST routes of Triton's system and CUDA shared memory extensions over the Service's ``serve.shm.Regions``.

    GET  /v2/systemsharedmemory[/region/{name}]/status      [{"name", "key", "offset", "byte_size"}, ...]
    POST /v2/systemsharedmemory/region/{name}/register      body {"key": "/k", "offset": 0, "byte_size": n}
    POST /v2/systemsharedmemory[/region/{name}]/unregister  one region, or every system region
    GET  /v2/cudasharedmemory[/region/{name}]/status        [{"name", "device_id", "byte_size"}, ...]
    POST /v2/cudasharedmemory/region/{name}/register        body {"raw_handle": {"b64": ...}, "device_id": 0,
                                                                  "byte_size": n}
    POST /v2/cudasharedmemory[/region/{name}]/unregister    one region, or every CUDA region

Errors are ``{"error": ...}`` with the status ``serve.shm`` chose (400, 404, 409). Regions do
not depend on a release: these routes answer while loading too.

``{name}`` is the region's name as registered, percent-decoded, and may hold ``/``: tritonclient.http
sends a name through ``urllib.parse.quote``, which leaves ``/`` as is (``region/a/b/status``), and
other clients send ``%2F``; both reach the region ``a/b`` (``RegionRoute``). Triton itself matches
``[^/]+`` against the undecoded path, so it cannot address such a name (registered over gRPC) over REST.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, compile_path

from tileship.serve import cuda_shm, shm
from tileship.serve.body import control_body
from tileship.serve.validate import BadRequest


def _kind(request: Request) -> str:
    return "cuda" if request.url.path.startswith("/v2/cuda") else "system"


async def status(request: Request) -> Response:
    try:
        return JSONResponse(request.app.state.service.shm.status(request.path_params.get("name"), _kind(request)))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None


async def register(request: Request) -> Response:
    service = request.app.state.service
    name = request.path_params["name"]
    try:
        shm.check_name(name)  # before the body is read: a bad name is refused whatever the body
        raw = await control_body(request)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(400, f"malformed JSON in the register request: {exc}") from None
        if _kind(request) == "cuda":
            if not isinstance(body, dict) or not {"raw_handle", "device_id", "byte_size"} <= body.keys():
                raise BadRequest(400, 'the register body must be a JSON object {"raw_handle": {"b64": "..."}, '
                                      '"device_id": 0, "byte_size": N}')
            handle = cuda_shm.raw_handle(body["raw_handle"], name)
            await asyncio.to_thread(service.shm.register_cuda, name, handle, body["device_id"], body["byte_size"])
        else:
            if not isinstance(body, dict) or "key" not in body or "byte_size" not in body:
                raise BadRequest(400, 'the register body must be a JSON object {"key": "/name", "offset": 0, '
                                      '"byte_size": N}')
            service.shm.register(name, body["key"], body.get("offset", 0), body["byte_size"])
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None
    return JSONResponse({})


async def unregister(request: Request) -> Response:
    try:
        await asyncio.to_thread(request.app.state.service.shm.unregister, request.path_params.get("name"),
                                _kind(request))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None
    return JSONResponse({})


class RegionRoute(Route):
    """A route whose ``{name}`` matches any run of characters, ``/`` and newlines included (the greedy
    ``{name:path}``, dot-all: ``region/a/register/status`` is the status of ``a/register``, and a name the
    registry refuses gets its 400, not a 404 for the route); ``path`` keeps ``{name}``, as the OpenAPI
    description names it."""

    def __init__(self, path: str, endpoint: Any, methods: list[str]) -> None:
        super().__init__(path, endpoint, methods=methods)
        regex, self.path_format, self.param_convertors = compile_path(path.replace("{name}", "{name:path}"))
        self.path_regex = re.compile(regex.pattern, re.DOTALL)


def _route(path: str, fn: Any, method: str) -> Route:
    return (RegionRoute if "{name}" in path else Route)(path, fn, methods=[method])


ROUTES = [_route(f"/v2/{kind}sharedmemory{path}", fn, method)
          for kind in ("system", "cuda")
          for path, fn, method in (("/status", status, "GET"), ("/region/{name}/status", status, "GET"),
                                   ("/region/{name}/register", register, "POST"), ("/unregister", unregister, "POST"),
                                   ("/region/{name}/unregister", unregister, "POST"))]
