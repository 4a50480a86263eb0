"""The HTTP protocol `jobq serve` runs (app/http/fastpath/transport.py): an answer's head and body in one
write, a head whose body comes later still sent at once, nothing held back when the connection closes."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from app.http.fastpath.transport import CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport(asyncio.Transport):
    """What reaches the socket: each write, in order, and whether the transport was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_head_and_body_go_out_in_one_write() -> None:
    async def run() -> list[bytes]:
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert real.writes == []  # held until the body comes
        transport.write(b"{}")
        await asyncio.sleep(0)  # the turn's end: nothing is left to write
        return real.writes

    assert asyncio.run(run()) == [b"HTTP/1.1 200 OK\r\n\r\n{}"]


def test_a_lone_write_goes_out_at_the_end_of_the_turn() -> None:
    async def run() -> tuple[list[bytes], list[bytes]]:
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())
        transport.write(bytearray(b"head"))
        before = list(real.writes)
        await asyncio.sleep(0)
        return before, real.writes

    assert asyncio.run(run()) == ([], [b"head"])


def test_closing_writes_what_is_held_first() -> None:
    async def run() -> RecordingTransport:
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())
        transport.write(b"last words")
        transport.close()
        await asyncio.sleep(0)
        return real

    real = asyncio.run(run())
    assert real.writes == [b"last words"] and real.closed


# --- a real server ---------------------------------------------------------------------------------


class App:
    """Three answers: at once, with the body after an event, and one that closes the connection."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.release: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self.loop, self.release = asyncio.get_running_loop(), asyncio.Event()
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b'{"ok": true}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if scope["path"] == "/close":
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["path"] == "/later":
            await self.release.wait()
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server() -> Iterator[tuple[App, int]]:
    app = App()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", http=CoalescingHttpToolsProtocol
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield app, server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _get(port: int, path: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return conn


def _read_until(conn: socket.socket, end: bytes) -> bytes:
    data = b""
    while end not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def test_answers_arrive_whole(server: tuple[App, int]) -> None:
    _, port = server
    with _get(port, "/now") as conn:
        answer = _read_until(conn, b'{"ok": true}')
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 12\r\n" in answer


def test_a_head_whose_body_comes_later_is_not_held_back(server: tuple[App, int]) -> None:
    app, port = server
    with _get(port, "/later") as conn:
        head = _read_until(conn, b"\r\n\r\n")  # before the app sends the body
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        app.loop.call_soon_threadsafe(app.release.set)
        assert _read_until(conn, b'{"ok": true}') == b'{"ok": true}'


def test_an_answer_that_closes_the_connection_is_written_first(server: tuple[App, int]) -> None:
    _, port = server
    with _get(port, "/close") as conn:
        answer = b""
        while chunk := conn.recv(65536):  # until the server closes
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b'{"ok": true}')
