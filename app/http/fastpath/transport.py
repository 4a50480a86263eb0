"""uvicorn's HTTP protocol (httptools), writing each answer to the socket in one piece.

uvicorn writes an answer's head the moment the app sends ``http.response.start`` and its body when the
app sends ``http.response.body``: two writes, so two ``send`` system calls and two TCP segments for an
answer of a few hundred bytes, and on the client's side often two reads. On one-job leases and acks
the two writes took a tenth of the service's time (py-spy), and the client and the kernel pay for each
as well. ``CoalescingTransport`` holds the head until the body comes, and writes the two at once: the body
follows at once when an endpoint sends it back to back (every answer of jobq's), so nothing waits; a
head whose body is not sent in the same turn of the event loop goes out at the end of that turn.

Everything else (reading, closing, flow control, the upgrade to WebSockets) is uvicorn's own; closing
writes what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Seconds an idle kept-alive connection stays open (`jobq serve`, app/cli.py). Longer than a client keeps
# one idle for reuse (httpx 5 s, aiohttp 15 s, Node's fetch 4 s) and than a load balancer's idle timeout
# (AWS ALB 60 s): a server that closes a connection first races the client's next request on it, which
# then fails with no answer (a POST the client cannot know whether to send again). uvicorn's default, 5 s,
# lost that race now and then under load.
KEEP_ALIVE = 75


class CoalescingTransport:
    """A transport that holds a write until the next one (the body after the head) or the end of the
    event loop's turn, whichever comes first, and then writes both at once."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = bytes(data)  # a copy: a buffer may change once we return
            self._loop.call_soon(self._flush)
        else:
            held, self._held = self._held, None
            self._transport.write(held + data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a ``CoalescingTransport`` (`jobq serve` passes it as `http`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
