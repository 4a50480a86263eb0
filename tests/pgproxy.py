"""A TCP proxy in front of PostgreSQL that can lose a connection right after a statement commits.

The fault a client cannot tell from any other: the server committed, and the answer never arrived. The
proxy forwards every byte both ways, reading PostgreSQL's message framing as it goes (protocol 3, no
TLS: give the client `sslmode=disable`). Once armed with `cut(text, nth)`, it watches for the `nth`
execution (Bind) of a prepared statement whose text holds `text`; from then on it keeps that
connection's answer to itself, and when the server reports the statement done and ready for the next
query (ReadyForQuery, sent after the implicit transaction commits at Sync) it closes both sides without
passing the answer on. The client sees its connection drop mid-statement; the database keeps the rows.

It runs its own event loop in a thread, so a service starting up (which blocks the test's thread) can
connect through it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class PgProxy:
    def __init__(self, upstream_dsn: str) -> None:
        parts = urlsplit(upstream_dsn)
        query = parse_qsl(parts.query)
        # A server on a unix socket (the embedded one: `?host=/its/directory`) or on TCP.
        socket_dir = next((v for k, v in query if k == "host" and v.startswith("/")), None)
        port = parts.port or 5432
        self._unix = f"{socket_dir}/.s.PGSQL.{port}" if socket_dir else None
        self._upstream = (parts.hostname or "127.0.0.1", port)
        # The client reaches the proxy over TCP: the socket directory is the proxy's business only.
        self._dsn = parts._replace(query=urlencode([(k, v) for k, v in query if k != "host"]))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._text: str | None = None
        self._remaining = 0  # matching executions to let through before the one to cut
        self.cut_done = threading.Event()
        self.cut_after_commit = False  # the cut statement had succeeded and its transaction committed

    def start(self) -> PgProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0), self._loop
        ).result(10)
        return self

    @property
    def dsn(self) -> str:
        """The upstream DSN, through the proxy."""
        port = self._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        netloc = self._dsn.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        query = "&".join(filter(None, [self._dsn.query, "sslmode=disable"]))
        return urlunsplit(
            self._dsn._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host, query=query)
        )

    def cut(self, text: str, nth: int = 1) -> None:
        """Lose the connection of the `nth` execution, from now on, of a statement holding `text`, once
        it has committed."""

        def arm() -> None:
            self._text, self._remaining = text, nth - 1

        self._loop.call_soon_threadsafe(arm)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if self._unix is not None:
                server_r, server_w = await asyncio.open_unix_connection(self._unix)
            else:
                server_r, server_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.close()
            return
        link = _Link(client_w, server_w)
        tasks = [
            asyncio.ensure_future(self._from_client(client_r, server_w, link)),
            asyncio.ensure_future(self._from_server(server_r, client_w, link)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        link.close()

    async def _from_client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, link: _Link) -> None:
        # The first message (startup or cancel request) has no type byte.
        (length,) = struct.unpack("!i", await r.readexactly(4))
        w.write(struct.pack("!i", length) + await r.readexactly(length - 4))
        statements: dict[bytes, str] = {}
        while True:
            kind = await r.readexactly(1)
            (length,) = struct.unpack("!i", await r.readexactly(4))
            body = await r.readexactly(length - 4)
            if kind == b"P":  # Parse: statement name, query text
                name, query = body.split(b"\0", 2)[:2]
                statements[name] = query.decode()
            elif kind == b"B" and self._text is not None:  # Bind: portal name, statement name
                name = body.split(b"\0", 2)[1]
                if self._text in statements.get(name, ""):
                    if self._remaining == 0:
                        self._text = None
                        link.holding = True
                    else:
                        self._remaining -= 1
            w.write(kind + struct.pack("!i", length) + body)
            await w.drain()

    async def _from_server(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, link: _Link) -> None:
        done = succeeded = False
        while True:
            kind = await r.readexactly(1)
            (length,) = struct.unpack("!i", await r.readexactly(4))
            body = await r.readexactly(length - 4)
            if link.holding:
                # CommandComplete, PortalSuspended (a row limit reached: asyncpg's fetchrow) or
                # ErrorResponse: the statement is over.
                if kind in (b"C", b"s", b"E"):
                    done, succeeded = True, kind != b"E"
                elif kind == b"Z" and done:  # ReadyForQuery: the transaction has ended ("I": idle)
                    self.cut_after_commit = succeeded and body == b"I"
                    self.cut_done.set()
                    return
                continue
            w.write(kind + struct.pack("!i", length) + body)
            await w.drain()


class _Link:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client, self.server = client, server
        self.holding = False  # the client is not to hear the rest of this connection

    def close(self) -> None:
        for writer in (self.client, self.server):
            writer.close()
