"""The HTTP/1.1 client of push deliveries (app/service/push.py): POST a body, read a bounded answer.

Why not aiohttp. A delivery is one small POST and one small answer, thousands a second from the event
loop that also serves the API; on this shape aiohttp spent 70 to 140 us of CPU per request (its request
and response objects, multidicts, stream readers, tracing hooks), more than the rest of a delivery. Here
the wire format is parsed by httptools (the C parser uvicorn serves with) and the connection is an
asyncio Protocol: one write per request, the answer's headers and at most `limit` bytes of its body kept,
in about a fifth of that.

What it does, and no more: HTTP/1.1 over TCP or TLS (the system's trust store, the host name checked),
keep-alive connections reused per (scheme, host, port) and dropped after IDLE seconds unused, chunked and
close-delimited answers, 1xx answers skipped. Redirects are answers like any other (never followed). No
proxies, cookies, compression or HTTP/2. A deadline is the caller's (`asyncio.timeout` around `post`):
cancelled, the connection is closed, never reused. A body larger than `limit` is cut there and its
connection closed, the rest never read.

Errors: OSError from connecting (ssl.SSLError for TLS, a subclass: catch it first), and Broken when the
connection fails or the answer is not HTTP once the request is on its way.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httptools

# Seconds an idle connection is kept for reuse: under the keep-alive timeout of common servers (uvicorn
# 5 s, nginx 75 s, Node 5 s), so that few requests meet a connection the server just closed.
IDLE = 4.0
# Idle connections kept per host at most.
IDLE_PER_HOST = 256
# Characters allowed unescaped in a request target (RFC 3986's pchar, "/" and "?" included, and "%"
# so that an escaped target stays as written).
TARGET_SAFE = "/?%:@!$&'()*+,;=-._~"


class Broken(Exception):
    """The connection failed, or the answer was not HTTP, once the request was on its way."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A URL, taken apart once: where to connect and what to send."""

    tls: bool
    host: str
    port: int
    target: str  # the request target: path and query, escaped
    authority: str  # the Host header

    @classmethod
    def of(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        target = quote(parts.path or "/", safe=TARGET_SAFE)
        if parts.query:
            target += "?" + quote(parts.query, safe=TARGET_SAFE)
        return cls(tls, host, port, target, parts.netloc.rpartition("@")[2].encode("idna").decode())


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case; a repeated header keeps its last value
    body: bytes  # at most the limit asked for


class _Connection(asyncio.Protocol):
    """One connection, one request at a time: the parser's callbacks fill in the answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.closed = False
        self.used_at = 0.0
        self._reset(0, 0)

    def _reset(self, limit: int, error_limit: int) -> None:
        self.limit, self.error_limit = limit, error_limit
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.keep = self.heard = self.headed = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for (an idle connection, or past an answer): not reused
            return
        self.heard = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Broken("the answer switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(Broken(f"the answer is not HTTP/1.1 ({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        if self.headed and "content-length" not in self.headers and "transfer-encoding" not in self.headers:
            self._answer(False)  # a body that ends where the connection does
        else:
            self._fail(Broken(f"the connection closed before the answer ended ({exc or 'by the server'})"))

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headed = self.status >= 200

    def on_body(self, body: bytes) -> None:
        limit = self.limit if 200 <= self.status < 300 else self.error_limit
        self.body += body[: limit - len(self.body)]
        if len(self.body) >= limit:
            self._answer(False)  # the rest is never read

    def on_message_complete(self) -> None:
        if self.status < 200:  # 100 Continue, 103 Early Hints: the answer follows
            self.headers.clear()
            return
        self._answer(self.parser.should_keep_alive())

    # ---

    def _answer(self, keep: bool) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.keep = keep
            self.waiter.set_result(Answer(self.status, self.headers, bytes(self.body)))

    def _fail(self, exc: Exception) -> None:
        self.keep = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Client:
    """Keep-alive connections per host, shared by every delivery of the process."""

    def __init__(self) -> None:
        self._idle: dict[tuple[bool, str, int], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, endpoint: Endpoint, headers: dict[str, str], body: bytes, limit: int, error_limit: int
    ) -> Answer:
        """POST `body` with `headers` (names in lower case, values without line breaks); the answer, with
        at most `limit` bytes of a 2xx answer's body and `error_limit` of another's."""
        head = [f"POST {endpoint.target} HTTP/1.1\r\nhost: {endpoint.authority}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        head.append(f"content-length: {len(body)}\r\n\r\n")
        request = "".join(head).encode("latin-1") + body
        connection, reused = await self._connection(endpoint)
        try:
            return await self._exchange(connection, request, limit, error_limit, endpoint)
        except Broken:
            if not (reused and not connection.heard):
                raise
        # A kept connection the server had closed before it read a byte of this request: once more, on a
        # new one (a delivery is at least once, its webhook-id the same).
        connection, _ = await self._connection(endpoint, fresh=True)
        return await self._exchange(connection, request, limit, error_limit, endpoint)

    async def _exchange(
        self, connection: _Connection, request: bytes, limit: int, error_limit: int, endpoint: Endpoint
    ) -> Answer:
        connection._reset(limit, error_limit)
        connection.waiter = asyncio.get_running_loop().create_future()
        try:
            assert connection.transport is not None
            connection.transport.write(request)
            answer = await connection.waiter
        except BaseException:
            connection.close()  # cancelled (a deadline) or failed: never reused
            raise
        if connection.keep and not connection.closed:
            self._keep(endpoint, connection)
        else:
            connection.close()
        return answer

    async def _connection(self, endpoint: Endpoint, fresh: bool = False) -> tuple[_Connection, bool]:
        """A kept connection to the endpoint's host (True), or a new one (False)."""
        if not fresh:
            idle = self._idle.get((endpoint.tls, endpoint.host, endpoint.port))
            now = time.monotonic()
            while idle:
                connection = idle.pop()
                if not connection.closed and now - connection.used_at < IDLE:
                    return connection, True
                connection.close()
        if endpoint.tls and self._tls is None:
            self._tls = ssl.create_default_context()
        _, connection = await asyncio.get_running_loop().create_connection(
            _Connection,
            endpoint.host,
            endpoint.port,
            ssl=self._tls if endpoint.tls else None,
            server_hostname=endpoint.host if endpoint.tls else None,
        )
        return connection, False

    def _keep(self, endpoint: Endpoint, connection: _Connection) -> None:
        idle = self._idle.setdefault((endpoint.tls, endpoint.host, endpoint.port), [])
        if len(idle) >= IDLE_PER_HOST:
            connection.close()
            return
        connection.used_at = time.monotonic()
        connection.waiter = None
        idle.append(connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
