"""What a request's head may say about its framing and handling, checked once its headers are in, where
httptools (llhttp) lets it through (RFC 9110, RFC 9112). Each refusal is a ``Refusal``: a status and a
message for the JSON answer, after which ``serve.connections`` closes the connection.

    Host               exactly one in an HTTP/1.1 request, at most one in any (RFC 9112 3.2: 400 otherwise)
    Transfer-Encoding  only ``chunked``: llhttp reads ``gzip, chunked`` as chunked and serves the body
                       still gzipped; any other coding is a 501 naming it (RFC 9112 6.1), the body's
                       framing unknown (compressed bodies take Content-Encoding, ``serve.content_coding``)
    Expect             only ``100-continue``, in any case (RFC 9110 10.1.1: 417 naming any other
                       expectation, which uvicorn ignored; tritonclient and curl send 100-continue)

A request whose Transfer-Encoding and Content-Length come together never gets here: llhttp refuses it
(a JSON 400, then the connection closes), as it refuses ``chunked`` that is not the last coding.
"""

from __future__ import annotations

from collections.abc import Iterable

from tileship.serve.validate import short


class Refusal(Exception):
    """A request refused: ``status`` (the status line's code and phrase) and ``message`` (the JSON answer's
    ``error``)."""

    def __init__(self, status: bytes, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason  # counted as ``tileship_rejected_total{reason=...}`` when given


def _members(value: bytes) -> list[bytes]:
    """The members of a comma-separated header value, stripped, empty ones left out (RFC 9110 5.6.1)."""
    return [m for m in (p.strip(b" \t") for p in value.split(b",")) if m]


def head_refusal(headers: Iterable[tuple[bytes, bytes]], http_version: str) -> Refusal | None:
    """Why a request with ``headers`` (lower-case names, as uvicorn keeps them) is refused, or None."""
    hosts = 0
    codings: list[bytes] = []
    expect: list[bytes] = []
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"transfer-encoding":
            codings += _members(value)
        elif name == b"expect":
            expect += _members(value)
    if hosts > 1 or (hosts == 0 and http_version == "1.1"):
        takes = "a request takes one" if hosts else "an HTTP/1.1 request takes exactly one"
        return Refusal(b"400 Bad Request", f"{takes} Host header; this one has {hosts}")
    for coding in codings:
        if coding.lower() != b"chunked":
            return Refusal(b"501 Not Implemented",
                           f"Transfer-Encoding {short(coding.decode('latin-1'))} is not implemented: send the body "
                           "with a Content-Length or Transfer-Encoding: chunked alone (to compress it, "
                           "Content-Encoding: gzip or deflate)")
    for member in expect:
        if member.lower() != b"100-continue":
            return Refusal(b"417 Expectation Failed",
                           f"Expect {short(member.decode('latin-1'))} is not supported: the one expectation "
                           "this server meets is 100-continue")
    return None
