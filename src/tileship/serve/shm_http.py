"""REST routes of Triton's system and CUDA shared memory extensions over the Service's ``serve.shm.Regions``.

    GET  /v2/systemsharedmemory[/region/{name}]/status      [{"name", "key", "offset", "byte_size"}, ...]
    POST /v2/systemsharedmemory/region/{name}/register      body {"key": "/k", "offset": 0, "byte_size": n}
    POST /v2/systemsharedmemory[/region/{name}]/unregister  one region, or every system region
    GET  /v2/cudasharedmemory[/region/{name}]/status        [{"name", "device_id", "byte_size"}, ...]
    POST /v2/cudasharedmemory/region/{name}/register        body {"raw_handle": {"b64": ...}, "device_id": 0,
                                                                  "byte_size": n}
    POST /v2/cudasharedmemory[/region/{name}]/unregister    one region, or every CUDA region

Errors are ``{"error": ...}`` with the status ``serve.shm`` chose (400, 404, 409); a register body
that holds a key twice in one object (``"byte_size"`` given twice) is a 400 naming the key. Regions do
not depend on a release: these routes answer while loading too.

``{name}`` is the region's name as registered, percent-decoded, and may hold ``/``: tritonclient.http
sends a name through ``urllib.parse.quote``, which leaves ``/`` as is (``region/a/b/status``), and
other clients send ``%2F``; both reach the region ``a/b`` (``RegionRoute``). Triton itself matches
``[^/]+`` against the undecoded path, so it cannot address such a name (registered over gRPC) over REST.
A name whose percent-decoded bytes are not UTF-8 (``%C3``, an encoded surrogate ``%ED%A0%80``) is a 400
naming it (``_name``): the server decodes the path with U+FFFD for such bytes, which would register, or
unregister, a region of another name; gRPC refuses such a name as a malformed message.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, compile_path

from tileship.release import strict_json
from tileship.serve import cuda_shm, shm
from tileship.serve.body import control_body
from tileship.serve.validate import BadRequest


def _kind(request: Request) -> str:
    return "cuda" if request.url.path.startswith("/v2/cuda") else "system"


def _name(request: Request) -> str | None:
    """The region name the path gives (None: every region). BadRequest 400 when its percent-decoded bytes are
    not UTF-8: the decoded path holds U+FFFD for them, the name of another region."""
    name = request.path_params.get("name")
    if name is not None and "\ufffd" in name:
        raw = request.scope.get("raw_path") or b""
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            shown = raw.decode("ascii", "replace").split("/region/", 1)[-1].rsplit("/", 1)[0]
            raise BadRequest(400, f"the region name {shown[:80]!r} in the path is not UTF-8 once percent-decoded; "
                                  "percent-encode the name's UTF-8 bytes") from None
    return name


async def status(request: Request) -> Response:
    try:
        return JSONResponse(request.app.state.service.shm.status(_name(request), _kind(request)))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None


async def register(request: Request) -> Response:
    service = request.app.state.service
    try:
        name = _name(request) or ""
        shm.check_name(name)  # before the body is read: a bad name is refused whatever the body
        raw = await control_body(request)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(400, f"malformed JSON in the register request: {exc}") from None
        twice = strict_json.duplicate_key(raw, body)
        if twice:  # orjson takes the last of two equal keys: a body that says two things is refused
            raise BadRequest(400, f"the register request body is refused: {twice}")
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
        await asyncio.to_thread(request.app.state.service.shm.unregister, _name(request), _kind(request))
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
