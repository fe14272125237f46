"""The OpenAPI description of the server's REST protocol (``openapi.json`` next to this module),
served at ``GET /v2/tileship/openapi.json``.

The file is written by hand and is the contract: tests/test_serve_schema_fuzz.py checks that every
route ``create_app`` registers is described in it (and nothing else is), and runs schemathesis
against a live server with it (no 5xx, responses that match their schemas).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

PATH = "/v2/tileship/openapi.json"


@functools.cache
def document() -> bytes:
    """The description's bytes, read from the package once."""
    return resources.files("tileship.serve").joinpath("openapi.json").read_bytes()


async def endpoint(request: Request) -> Response:
    from starlette.responses import Response

    return Response(document(), media_type="application/json")
