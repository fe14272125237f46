"""Connection limits under uvicorn: a header-read deadline that uvicorn lacks, and its own settings.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past
``limit_concurrency`` connections, but a connection whose request headers never finish is kept
open forever. ``guarded_http(header_timeout_s)`` is uvicorn's httptools protocol with a timer
armed whenever a request may begin (on connect, and on the first byte after a response) and
cancelled when the headers are complete: past it the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _GuardedHttp(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:  # bytes of a new request's head
            self._arm()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection: request headers did not arrive within %gs", self.header_timeout_s)
            self.transport.close()


def guarded_http(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header-read deadline of ``header_timeout_s`` seconds."""
    return type("GuardedHttp", (_GuardedHttp,), {"header_timeout_s": header_timeout_s})


def uvicorn_limits(config: Any) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for a ``ServeConfig``'s connection settings."""
    return {"http": guarded_http(config.header_timeout_s), "timeout_keep_alive": config.keep_alive_s,
            "limit_concurrency": config.max_connections, "h11_max_incomplete_event_size": 64 << 10}
