"""Connection limits under uvicorn: a header-read deadline that uvicorn lacks, and its own settings.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past
``limit_concurrency`` connections, but a connection whose request headers never finish is kept
open forever. ``guarded_http(header_timeout_s)`` is uvicorn's httptools protocol with a timer
armed whenever a request may begin (on connect, and on the first byte after a response) and
cancelled when the headers are complete: past it the connection is closed. Its transport is
wrapped in ``serve.one_write.OneWrite``, so a response's head and its body leave in one write. A request past
``limit_concurrency`` gets a JSON 503 with ``Retry-After`` (``over_limit``) in place of uvicorn's
plain-text one, counted as ``tileship_rejected_total{reason="connection_limit"}``. Bytes that are no HTTP
request get a JSON 400 naming what the parser refused, where uvicorn sends plain text, and a head that
``serve.framing`` refuses (a transfer coding other than chunked: 501; an Expect other than 100-continue:
417; no Host or two: 400) its JSON answer. A request whose line and headers pass ``REQUEST_HEAD_LIMIT``
gets a JSON 431 (counted as ``reason="headers_too_large"``): httptools has no such bound, and joins a long
header's pieces by copying, so one client sending megabytes of header slowed every other request on the
event loop. The trailer fields of a chunked body have the same bound (431, the same count), and a chunk
line (its size and extensions) too (400): no bound held either, trailers were joined by copying as headers
were, and added to the request's headers after its app had read them (they are dropped now). After each
of these refusals the connection is closed, its client's bytes read and dropped for ``LINGER_S`` first, so
that the answer is not lost to a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tileship.serve import framing
from tileship.serve.one_write import OneWrite
from tileship.serve.validate import short

#: the most bytes a request's line and headers may take (431 past it; uvicorn's h11 bound too)
REQUEST_HEAD_LIMIT = 64 << 10
#: the answer to trailer fields past ``REQUEST_HEAD_LIMIT`` (a ``framing.Refusal``'s arguments)
_TRAILERS = (b"431 Request Header Fields Too Large",
             f"the trailer fields of the chunked body pass {REQUEST_HEAD_LIMIT} bytes, the limit", "headers_too_large")
#: how long a refused connection stays open, reading and dropping, so that its client reads the answer
LINGER_S = 1.0


async def over_limit(scope: Any, receive: Any, send: Any) -> None:
    """The answer to a request past the connection limit: a KServe-style JSON error, then close."""
    body = orjson.dumps({"error": "the server is at its connection limit: retry later"})
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _GuardedHttp(HttpToolsProtocol):
    """The header deadline is a time (``_deadline``; None: disarmed) checked by one timer per connection,
    which moves itself to a later deadline when it fires early: arming and disarming on every keep-alive
    request set an attribute instead of making and cancelling a timer."""

    header_timeout_s: float = 10.0
    rejected: Any = None  # a prometheus Counter with a ``reason`` label, or None
    _header_timer: asyncio.TimerHandle | None = None
    _deadline: float | None = None
    _in_head = False  # a request's line and headers are being parsed
    _heads = 0  # requests begun on this connection
    _between = True  # no request is being parsed: the next byte starts one
    _head_bytes = 0  # bytes of the current request's head seen so far (a lower bound)
    _refused = False  # refused: reading on only so that the client gets the answer, not a reset
    _pending: list[tuple[bytes, str] | None] = []  # a refusal's answer (None: none) waiting for those ahead of it
    _cycle_heads = 0  # ``_heads`` when ``cycle`` began: it is the request being parsed when equal
    _events = 0  # parser callbacks past a request's head: bytes that bring none are a chunk line's or a trailer's
    _quiet = 0  # bytes of a body that brought no callback, in a row (a lower bound)
    _in_chunk = False  # between a chunk's size line and its end: quiet bytes there are trailer fields
    _trailer_bytes = 0  # the trailer fields' bytes so far

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(OneWrite(transport, self.loop))  # type: ignore[arg-type]
        self._arm()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.time() + self.header_timeout_s
            if self._header_timer is None:
                self._header_timer = self.loop.call_at(self._deadline, self._check_deadline)

    def _disarm(self) -> None:
        self._deadline = None

    def _check_deadline(self) -> None:
        self._header_timer = None
        if self._deadline is None:  # disarmed: the next ``_arm`` starts a timer again
            return
        # re-armed since this timer was set: wait for the new deadline (a timer's millisecond may fire it early)
        if self.loop.time() < self._deadline - 1e-3:
            self._header_timer = self.loop.call_at(self._deadline, self._check_deadline)
            return
        self._deadline = None
        self._headers_late()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # refused: what follows is read and dropped until the connection closes
            return
        if self.cycle is None or self.cycle.response_complete:  # bytes of a new request's head
            self._arm()
        heads, between, events = self._heads, self._between, self._events
        super().data_received(data)
        # all of ``data`` is the current request's head when no request began in it, or when it began the
        # only one and no earlier request's bytes came before (else the count leaves it out: a lower bound)
        if self._in_head and (self._heads == heads or (between and self._heads == heads + 1)):
            self._head_bytes += len(data)
            if self._head_bytes > REQUEST_HEAD_LIMIT and not self.transport.is_closing():
                self._headers_too_large()
        elif not self._in_head and not self._between and not self._refused:  # in a body
            self._quiet = self._quiet + len(data) if self._events == events else 0
            if self._quiet > REQUEST_HEAD_LIMIT:
                self._chunk_framing_too_large()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._between, self._head_bytes, self._heads = True, False, 0, self._heads + 1
        self._quiet = self._trailer_bytes = 0
        self._events += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            super().on_header(name, value)
            return
        # a trailer field of a chunked body: counted, and left out (the app read the request's headers already)
        self._events += 1
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > REQUEST_HEAD_LIMIT:
            raise framing.Refusal(*_TRAILERS)

    def on_chunk_header(self) -> None:
        self._events += 1
        self._in_chunk = True

    def on_chunk_complete(self) -> None:
        self._events += 1
        self._in_chunk = False

    def on_message_complete(self) -> None:
        self._events += 1
        self._between = True
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._events += 1
        self._disarm()
        refusal = framing.head_refusal(self.headers, self.parser.get_http_version())
        if refusal is not None:  # httptools stops and raises; uvicorn hands that to ``send_400_response``
            raise refusal
        super().on_headers_complete()
        self._cycle_heads = self._heads
        if self.cycle is not None:
            self.cycle.tileship_sinkable = True  # type: ignore[attr-defined]  # ``on_body`` feeds its sink
            self.cycle.tileship_conn = self  # type: ignore[attr-defined]  # ``serve.body_pull`` may read its body

    def body_pulled(self, cycle: Any) -> None:
        """``cycle``'s body was read from the socket past the parser (``serve.body_pull``): the message is
        complete, the next bytes start a new request (a fresh parser), and the connection reads again."""
        self._between = True
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3, as uvicorn does
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        cycle.more_body = False
        cycle.message_event.set()
        if not self.transport.is_closing():
            self.flow.resume_reading()

    def on_body(self, body: bytes) -> None:
        """A chunk of a request body: into the block of the request's ``serve.body.Sink`` when its reader
        installed one (one copy, and no pause: the block has room for the whole body), else uvicorn's way."""
        self._events += 1
        cycle = self.cycle
        sink = getattr(cycle, "tileship_sink", None)
        if sink is None or cycle.response_complete:
            super().on_body(body)
            return
        sink.write(body)
        cycle.message_event.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if app is service_unavailable:  # uvicorn's choice past limit_concurrency (pipelined requests too)
            app = over_limit
            if self.rejected is not None:
                self.rejected.labels("connection_limit").inc()
        super()._start_asgi_task(cycle, app)

    def _unsupported_upgrade_warning(self) -> None:
        """An Upgrade (websocket, h2c) is ignored and the request served as HTTP/1.1: nothing to warn of
        (uvicorn's warning would tell to install a WebSocket library)."""
        self.logger.debug("an Upgrade request was served as HTTP/1.1")

    def _headers_late(self) -> None:
        if not self.transport.is_closing():
            self.logger.info("closing a connection: request headers did not arrive within %gs", self.header_timeout_s)
            self.transport.close()


    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are no HTTP request (called in its ``except HttpParserError``), as
        JSON naming what the parser refused (``Invalid character in Content-Length``, a request target that
        is no path, ...), or the answer of a ``framing.Refusal`` raised in a callback; then the connection
        closes."""
        exc = sys.exc_info()[1]
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
        if isinstance(cause, framing.Refusal):
            if cause.reason is not None and self.rejected is not None:
                self.rejected.labels(cause.reason).inc()
            self._refuse(cause.status, cause.message)
            return
        why = str(exc) if isinstance(exc, httptools.HttpParserError) and str(exc) else msg
        if isinstance(cause, httptools.HttpParserInvalidURLError):  # from uvicorn's parse_url: "User callback error"
            why = f"the request target {short(self.url.decode('latin-1'))} is neither a path nor an absolute URL"
        self._refuse(b"400 Bad Request", f"invalid HTTP request: {why[:200]}")

    def _refuse(self, status: bytes, message: str) -> None:
        """Answer ``status`` with ``{"error": message}`` and close (``_answer_and_close``), once the answers
        to the requests ahead of the refused one are out: pipelined requests are answered in order. The
        refused request's own ASGI cycle, when its body was being read, stops (it reads a disconnect and
        sends nothing); when it had answered already, the connection just closes. What the client sends
        from here on is dropped."""
        self._disarm()
        self._refused = True
        cycle = self.cycle
        answer: tuple[bytes, str] | None = (status, message)
        if cycle is not None and self._cycle_heads == self._heads:  # refused in its body: the cycle is its own
            if cycle.response_started:
                answer = None
            cycle.disconnected = True
            cycle.message_event.set()
            waiting = len(self.pipeline)
            self.pipeline = deque(p for p in self.pipeline if p[0] is not cycle)
            in_flight = len(self.pipeline) < waiting  # it was queued behind a request in flight
        else:
            in_flight = cycle is not None and not cycle.response_complete
        if in_flight:
            self._pending = [answer]
            return
        self._answer_and_close(answer)

    def on_response_complete(self) -> None:
        last = not self.pipeline  # no request waits: this was the last one in flight
        super().on_response_complete()
        if last and self._pending:
            (answer,), self._pending = self._pending, []
            self._answer_and_close(answer)

    def _answer_and_close(self, answer: tuple[bytes, str] | None) -> None:
        """Send ``answer`` (status, message) as JSON, if any, and close. Closing at once, with the client's
        bytes unread, would reset the connection and lose the answer: the answer and the end of the stream
        go out, what still comes is dropped for ``LINGER_S``, then the connection closes."""
        if self.transport.is_closing():
            return
        if answer is not None:
            body = orjson.dumps({"error": answer[1]})
            self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (answer[0], len(body), body))
        try:
            self.transport.write_eof()
        except OSError:  # the client is gone already
            self.transport.close()
            return
        self.loop.call_later(LINGER_S, self.transport.close)

    def _chunk_framing_too_large(self) -> None:
        if not self._in_chunk:
            self._refuse(b"400 Bad Request", f"a chunk line of the chunked body passes {REQUEST_HEAD_LIMIT} bytes, "
                                             "the limit")
            return
        if self.rejected is not None:
            self.rejected.labels(_TRAILERS[2]).inc()
        self._refuse(*_TRAILERS[:2])

    def _headers_too_large(self) -> None:
        if self.rejected is not None:
            self.rejected.labels("headers_too_large").inc()
        self._refuse(b"431 Request Header Fields Too Large",
                     f"the request line and headers pass {REQUEST_HEAD_LIMIT} bytes, the limit")


def guarded_http(header_timeout_s: float, rejected: Any = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header-read deadline of ``header_timeout_s`` seconds, its
    503s past the connection limit as JSON and counted on ``rejected`` (when given)."""
    return type("GuardedHttp", (_GuardedHttp,), {"header_timeout_s": header_timeout_s, "rejected": rejected})


def uvicorn_limits(config: Any, rejected: Any = None) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for a ``ServeConfig``'s connection settings (``rejected``: the
    server's ``tileship_rejected`` counter). No WebSocket: the app has no such route, and uvicorn answered
    an upgrade request with an empty 403; it is served as HTTP/1.1 instead (an Upgrade a server may ignore)."""
    return {"http": guarded_http(config.header_timeout_s, rejected), "timeout_keep_alive": config.keep_alive_s,
            "limit_concurrency": config.max_connections, "h11_max_incomplete_event_size": REQUEST_HEAD_LIMIT,
            "ws": "none"}
