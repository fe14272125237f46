"""``/v2/tileship/canary``: start (POST), read (GET) and abort (DELETE) the server's canary.

POST body (JSON)::

    {"release": "<release directory, or id / unique prefix in the registry the server follows>",
     "fraction": 0.1, "window_requests": 100, "window_seconds": 0, "max_p50_ratio": 1.1,
     "max_extra_errors": 0, "min_samples": 10, "noise_z": 2.0}

Only ``release`` is required; the rest default to ``serve.canary.CanaryPolicy``. The POST
returns once the canary is loaded and warmed (200 ``{"result": "started", ...status}``) or
refused (409 ``{"result": "failed", "stage", "error", "serving"}``; 400 for a bad body). GET
returns ``Rollout.status()``: state (``loading``, ``running``, ``promoting``, ``promoted``,
``rolled_back``, ``aborted``, ``failed``), the windows, every logged decision with its numbers,
and the result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tileship.errors import TileshipError
from tileship.serve.body import control_body
from tileship.serve.canary import CanaryPolicy
from tileship.serve.validate import BadRequest, short

#: the longest ``release`` a canary request may name (Linux's PATH_MAX)
MAX_RELEASE_CHARS = 4096
_FIELDS = {f.name: f.type for f in dataclasses.fields(CanaryPolicy)}


def parse(body: bytes) -> tuple[str, CanaryPolicy]:
    """The release and policy a POST names; TileshipError naming the field otherwise."""
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise TileshipError(f"malformed JSON in the canary request: {exc}") from None
    if not isinstance(doc, dict):
        raise TileshipError("the canary request must be a JSON object")
    release = doc.pop("release", None)
    if not isinstance(release, str) or not release:
        raise TileshipError("'release' is required: a release directory or a registry release id")
    if len(release) > MAX_RELEASE_CHARS or "\0" in release:
        raise TileshipError(f"'release' must be a path or release id of at most {MAX_RELEASE_CHARS} characters "
                            f"without NUL, got {short(release)}")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise TileshipError(f"unknown field {short(unknown[0])} in the canary request",
                            hint=f"known: release, {', '.join(_FIELDS)}")
    values: dict[str, Any] = {}
    for key, value in doc.items():
        want = int if _FIELDS[key] in ("int", int) else float
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (want is int and not isinstance(value, int)):
            raise TileshipError(f"{key!r} must be a number ({want.__name__}), not {value!r:.40}")
        values[key] = want(value)
    return release, CanaryPolicy(**values).check()


async def endpoint(request: Request) -> Response:
    rollout = request.app.state.service.canary
    if request.method == "GET":
        return JSONResponse(rollout.status())
    if request.method == "DELETE":
        status, body = rollout.abort()
        return JSONResponse(body, status_code=status)
    try:
        release, policy = parse(await control_body(request))
    except BadRequest as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status)
    except TileshipError as exc:
        return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=400)
    status, body = await rollout.start(release, policy)
    return JSONResponse(body, status_code=status)
