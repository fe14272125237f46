"""ASGI plumbing of the server: request ids on every request and responses streamed from their parts."""

from __future__ import annotations

import itertools
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tileship.serve.app import Service

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


def valid_request_id(sent: str | None) -> str | None:
    """A client's request id when it is printable ASCII up to 128 characters, else None (make one)."""
    return sent if sent is not None and _REQUEST_ID.match(sent) else None


def infer_path_params(scope: Any) -> dict[str, str] | None:
    """The path parameters of ``POST /v2/models/{name}[/versions/{version}]/infer`` (the two routes
    ``routes.create_app`` gives ``Service.infer``), matched as Starlette matches them (a parameter is
    one non-empty path segment); None for any other request, which the Starlette app routes. The
    handler never raises (``calls.run`` answers every error), so skipping Starlette's router and
    exception middleware on the server's busiest route (about 15% of a small request's time in the
    app, profiled on the CPU machine) changes nothing else; an app mounted under a root path goes
    through Starlette."""
    if scope["method"] != "POST" or scope.get("root_path"):
        return None
    parts = scope["path"].split("/")
    if len(parts) == 5 and parts[4] == "infer" and parts[3] and parts[:3] == _MODELS:
        return {"name": parts[3]}
    if (len(parts) == 7 and parts[6] == "infer" and parts[4] == "versions" and parts[3] and parts[5]
            and parts[:3] == _MODELS):
        return {"name": parts[3], "version": parts[5]}
    return None


_MODELS = ["", "v2", "models"]


#: a response body at most this large is joined and sent in one piece (``PartsResponse``)
JOIN_BYTES = 1 << 16


class PartsResponse:
    """A response whose body is sent as its parts (JSON header, then tensor bytes) without
    joining them into one buffer first; a small one (at most ``JOIN_BYTES``) is joined, since each
    part is a write of its own."""

    def __init__(self, status: int, parts: list[Any], media_type: bytes, headers: list[tuple[bytes, bytes]],
                 complete: bool = False) -> None:
        self.status_code = status
        self.parts = parts
        self.size = size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        self.headers = [(b"content-type", media_type), (b"content-length", str(size).encode()), *headers]
        #: ``headers`` hold the request id and the release and evidence headers already (``RequestIds``)
        self.complete = complete
        self.started = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.started = True
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        if self.size <= JOIN_BYTES:  # one write (one segment, one wake-up of the client) beats a copy this small
            await send({"type": "http.response.body", "body": b"".join(self.parts), "more_body": False})
            return
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})


class Incoming:
    """What ``Service.infer`` reads of an inference request that skipped Starlette: the scope, ``receive``,
    the path parameters and the headers it looks at (the first of each name, as Starlette's ``Headers.get``
    gives it; Content-Encoding fields sent more than once joined into one list, which ``content_coding``
    refuses). Duck-types the few ``starlette.requests.Request`` attributes the handler uses."""

    __slots__ = ("headers", "path_params", "receive", "scope")

    def __init__(self, scope: Any, receive: Any, headers: dict[str, str], path_params: dict[str, str]) -> None:
        self.scope, self.receive, self.headers, self.path_params = scope, receive, headers, path_params


#: the request headers ``Service.infer`` (and ``serve.body``) read, collected in one pass over the scope
_INFER_HEADERS = frozenset((b"content-type", b"content-length", b"content-encoding",
                            b"inference-header-content-length"))


def new_request_id() -> str:
    """A fresh request id: 32 hex digits, as ``uuid4().hex`` gave: 64 random bits drawn once per process
    (again in a forked child) and a 64-bit count, so no two ids of a process repeat and no system call is made."""
    return f"{_id_prefix}{next(_id_count) & _ID_MASK:016x}"


def _new_id_prefix() -> None:
    global _id_prefix, _id_count
    _id_prefix, _id_count = os.urandom(8).hex(), itertools.count()


_ID_MASK = (1 << 64) - 1
_id_prefix, _id_count = "", itertools.count()
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)


class RequestIds:
    """ASGI middleware: a request id for every request (the client's ``x-request-id`` when it
    is printable ASCII up to 128 chars), echoed back, plus the release headers on responses
    that did not set them (health, metadata, errors). Inference requests go straight to
    ``Service.infer`` (``infer_path_params``); every other request through the Starlette app.
    A response that says ``complete`` (``PartsResponse`` of an answered inference) carries every
    one of those headers already and is sent as it is."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        params = infer_path_params(scope)
        heads: dict[str, str] = {}
        seen_rid = False
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                if not seen_rid:
                    seen_rid = True
                    text = v.decode("latin-1")
                    rid = text if _REQUEST_ID.match(text) else None
            elif params is not None and k in _INFER_HEADERS:
                name = k.decode("latin-1")
                if name not in heads:
                    heads[name] = v.decode("latin-1")
                elif name == "content-encoding":  # fields sent twice are one list (RFC 9110 5.3), refused whole
                    heads[name] += ", " + v.decode("latin-1")
        rid = rid or new_request_id()
        scope["tileship.request_id"] = rid
        rid_b = rid.encode()

        started = False

        async def send_with_ids(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", ()))
                headers.append((b"x-request-id", rid_b))
                if not any(k == b"x-tileship-release" for k, _ in headers):
                    served = scope.get("tileship.served") or self.service.holder.current
                    headers.append((b"x-tileship-release", served.release_id.encode() if served else b"none"))
                    headers.append((b"x-tileship-kernel-revision",
                                    served.release.kernel_revision.encode() if served else b"none"))
                if not any(k == b"x-tileship-evidence" for k, _ in headers):  # the evidence digest in effect
                    served = scope.get("tileship.served") or self.service.holder.current
                    digest = getattr(served.release, "evidence_digest", "none") if served else "none"
                    headers.append((b"x-tileship-evidence", digest.encode()))
                message = {**message, "headers": headers}
            await send(message)

        response: Any = None
        try:
            if params is None:
                await self.app(scope, receive, send_with_ids)
            else:  # the inference route straight to its handler (``infer_path_params``)
                scope["path_params"] = params
                response = await self.service.infer(Incoming(scope, receive, heads, params))
                await response(scope, receive, send if getattr(response, "complete", False) else send_with_ids)
        except Exception as exc:  # the last fence: whatever escaped the app is a logged 500, never a dropped connection
            if started or getattr(response, "started", False):  # an answer began already (and was logged, re-raised)
                return
            await self.service.internal_error(rid, exc)(scope, receive, send_with_ids)
