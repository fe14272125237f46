"""REST routes of Triton's system shared memory extension over the Service's ``serve.shm.Regions``.

    GET  /v2/systemsharedmemory[/region/{name}]/status      [{"name", "key", "offset", "byte_size"}, ...]
    POST /v2/systemsharedmemory/region/{name}/register      body {"key": "/k", "offset": 0, "byte_size": n}
    POST /v2/systemsharedmemory[/region/{name}]/unregister  one region, or every region

Errors are ``{"error": ...}`` with the status ``serve.shm`` chose (400, 404, 409). Regions do
not depend on a release: these routes answer while loading too.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tileship.serve.body import read_body
from tileship.serve.validate import BadRequest

#: the largest register body read (the three fields, with room to spare)
MAX_BODY = 64 << 10


def _regions(request: Request) -> Any:
    return request.app.state.service.shm


async def status(request: Request) -> Response:
    try:
        return JSONResponse(_regions(request).status(request.path_params.get("name")))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None


async def register(request: Request) -> Response:
    service = request.app.state.service
    try:
        raw = await read_body(request, limit=MAX_BODY, timeout_s=service.config.body_timeout_s,
                              rejected=service.metrics.rejected)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(400, f"malformed JSON in the register request: {exc}") from None
        if not isinstance(body, dict) or "key" not in body or "byte_size" not in body:
            raise BadRequest(400, 'the register body must be a JSON object {"key": "/name", "offset": 0, '
                                  '"byte_size": N}')
        service.shm.register(request.path_params["name"], body["key"], body.get("offset", 0), body["byte_size"])
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None
    return JSONResponse({})


async def unregister(request: Request) -> Response:
    try:
        _regions(request).unregister(request.path_params.get("name"))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None
    return JSONResponse({})


ROUTES = [
    Route("/v2/systemsharedmemory/status", status, methods=["GET"]),
    Route("/v2/systemsharedmemory/region/{name}/status", status, methods=["GET"]),
    Route("/v2/systemsharedmemory/region/{name}/register", register, methods=["POST"]),
    Route("/v2/systemsharedmemory/unregister", unregister, methods=["POST"]),
    Route("/v2/systemsharedmemory/region/{name}/unregister", unregister, methods=["POST"]),
]
