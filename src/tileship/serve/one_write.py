"""A connection's transport that sends a response's head and body in one write (``OneWrite``), for
``serve.connections``' protocol."""

from __future__ import annotations

import asyncio
from typing import Any

#: a write at most this large that ends a response head is held for the body that follows it
HEAD_BYTES = 16 << 10
#: a body at most this large is joined to the held head (one copy); a larger one follows it in a write of its own
JOIN_BYTES = 1 << 20


class OneWrite:
    """A connection's transport whose writes of a response head (a write of at most ``HEAD_BYTES``
    ending in a blank line) are held until the next write, which then goes out joined to it, or until
    the event loop's next turn, whichever comes first. uvicorn writes a response's head and body in
    two ``send`` calls: on loopback each one is a segment and a wake-up of the client, the largest
    single cost of a small request in the server (profiled on the CPU machine). Nothing is reordered
    or dropped: ``close`` and ``write_eof`` send what is held first; every other attribute is the
    transport's own."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: Any) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= JOIN_BYTES:
                self._transport.write(held + data)
                return
            self._transport.write(held)
        elif len(data) <= HEAD_BYTES and data[-4:] == b"\r\n\r\n":
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send what is held, if anything (a head whose body has not come by the loop's next turn)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def writelines(self, data: Any) -> None:
        self.flush()
        self._transport.writelines(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
