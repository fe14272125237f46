"""Compressed request bodies: ``Content-Encoding: gzip`` or ``deflate`` on an inference request, what
tritonclient sends with ``request_compression_algorithm`` and Triton accepts.

The body is inflated, at most the server's body limit (``--max-body-mib``) of it: a small body that
inflates past the limit (a zip bomb) is refused with 413 once the limit is reached, never inflated
whole. ``Inference-Header-Content-Length`` counts the inflated body's JSON header, as tritonclient
sets it. A body of more than ``LOOP_BYTES``, compressed or inflated, is inflated on a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from tileship.serve.validate import BadRequest, short

#: Content-Encoding -> zlib's ``wbits`` for it (RFC 9110: ``deflate`` is the zlib format, as ``zlib.compress`` writes)
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: a body compressed or inflated larger than this is inflated on a thread (a small bomb never stalls the loop)
LOOP_BYTES = 64 << 10


def coding(header: str | None) -> str | None:
    """The content coding a ``Content-Encoding`` header names: None for none (absent, empty or
    ``identity``), else ``gzip`` or ``deflate``. Raises BadRequest 415 for any other coding, or a list of several
    (``identity, gzip``, or the header sent twice): the body is never decoded by one of them only."""
    if header is None:
        return None
    names = [part.strip().lower() for part in header.split(",") if part.strip()]
    if len(names) > 1:
        raise BadRequest(415, f"Content-Encoding {short(header)} names {len(names)} codings (a list, or the header "
                              "sent more than once): send one, gzip or deflate, or none")
    name = names[0] if names else ""
    if name in ("", "identity"):
        return None
    if name not in WBITS:
        raise BadRequest(415, f"Content-Encoding {short(header)} is not supported: send the body as is, "
                              "or compressed with gzip or deflate")
    return "gzip" if name == "x-gzip" else name


def inflate(data: Any, name: str, limit: int, budget: int | None = None) -> bytearray | None:
    """``data`` (a body compressed with ``name``, from ``coding``) inflated, in a writable buffer (binary
    inputs are viewed in place as tensors, which torch wants writable); None when ``budget`` is given and
    the body inflates past it (nothing else is done then). Raises BadRequest: 413 when it inflates past
    ``limit`` bytes (stopping there), 400 when it is not one whole stream of ``name``."""
    cap = limit if budget is None else min(limit, budget)
    d = zlib.decompressobj(WBITS[name])
    try:
        out = d.decompress(data, cap + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"the body is not valid {name} data (Content-Encoding: {name}): {exc}") from None
    if len(out) > cap:
        if cap < limit:
            return None
        raise BadRequest(413, f"the {name} body inflates past {limit} bytes, the limit (--max-body-mib)")
    if not d.eof:
        raise BadRequest(400, f"the {name} body ends before its compressed stream does (Content-Encoding: {name})")
    if d.unused_data:
        raise BadRequest(400, f"the {name} body has {len(d.unused_data)} bytes after its compressed stream")
    return bytearray(out)


async def inflated(data: Any, lease: Any, name: str | None, limit: int) -> tuple[Any, Any]:
    """(body, lease) as they are when ``name`` (from ``coding``) is None, else (``data`` inflated, None):
    the compressed bytes are read by then, so their pooled block (``lease``, ``serve.staging``) goes back
    here. Raises BadRequest as ``inflate`` does (the caller still holds ``lease`` then). A body that is
    small on both sides of the coding is inflated on the event loop, any other on a thread."""
    if name is None:
        return data, lease
    out = inflate(data, name, limit, LOOP_BYTES) if len(data) <= LOOP_BYTES else None
    if out is None:
        out = await asyncio.to_thread(inflate, data, name, limit)
    assert out is not None  # no budget: inflated whole, or raised
    if lease is not None:
        lease.give_back()
    return out, None
