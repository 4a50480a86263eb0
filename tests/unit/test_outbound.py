"""The HTTP/1.1 client of push deliveries (app/service/outbound.py), against servers on 127.0.0.1 that
answer with scripted bytes: how each shape of answer is read, what is kept and what is cut, and when a
connection is reused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from app.service.outbound import Answer, Broken, Client, Endpoint

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Answers each connection with `script`; counts connections and keeps the requests' heads."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head and Content-Length body); its head."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        return head


def answering(server_of: Callable[[], Server], *answers: bytes, then_close: bool = False) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await server_of().request(reader)
            writer.write(answer)
            await writer.drain()
        if then_close:
            return
        await reader.read()  # keep the connection until the client closes it

    return script


async def post(client: Client, url: str, limit: int = 1000, error_limit: int = 100) -> Answer:
    return await client.post(
        Endpoint.of(url), {"content-type": "application/json"}, b'{"a":1}', limit, error_limit
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def test_a_plain_answer_and_its_connection_reused() -> None:
    async def test() -> None:
        ok = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"r":1}'
        holder: list[Server] = []
        async with Server(answering(lambda: holder[0], ok, ok, ok)) as server:
            holder.append(server)
            client = Client()
            for _ in range(3):
                answer = await post(client, server.url("/hook?x=1"))
                assert (answer.status, answer.body) == (200, b'{"r":1}')
                assert answer.headers["content-type"] == "application/json"
            assert server.connections == 1
            assert server.heads[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
            client.close()

    run(test)


def test_chunked_and_close_delimited_answers_are_read_whole() -> None:
    async def test() -> None:
        chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        holder: list[Server] = []
        async with Server(answering(lambda: holder[0], chunked)) as server:
            holder.append(server)
            assert (await post(Client(), server.url())).body == b"abcde"
        until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
        holder.clear()
        async with Server(answering(lambda: holder[0], until_close, then_close=True)) as server:
            holder.append(server)
            assert (await post(Client(), server.url())).body == b"all of it"

    run(test)


def test_an_informational_answer_is_skipped() -> None:
    async def test() -> None:
        answers = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"
        holder: list[Server] = []
        async with Server(answering(lambda: holder[0], answers)) as server:
            holder.append(server)
            answer = await post(Client(), server.url())
            assert answer.status == 204 and "link" not in answer.headers

    run(test)


def test_a_body_over_the_limit_is_cut_and_its_connection_not_reused() -> None:
    async def test() -> None:
        big = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000
        error = b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + b"e" * 5000
        for answer, limits, kept in ((big, (11, 100), b"x" * 11), (error, (1000, 7), b"e" * 7)):
            holder: list[Server] = []
            async with Server(answering(lambda: holder[0], answer, answer)) as server:
                holder.append(server)
                client = Client()
                for _ in range(2):
                    assert (await post(client, server.url(), *limits)).body == kept
                assert server.connections == 2  # the rest never read: a new connection each time

    run(test)


def test_a_kept_connection_the_server_closed_is_replaced_once() -> None:
    async def test() -> None:
        ok = b"HTTP/1.1 204 No Content\r\n\r\n"
        holder: list[Server] = []
        # Each connection answers one request and closes without saying so (no Connection: close).
        async with Server(answering(lambda: holder[0], ok, then_close=True)) as server:
            holder.append(server)
            client = Client()
            assert (await post(client, server.url())).status == 204
            await asyncio.sleep(0.05)  # the close arrives
            assert (await post(client, server.url())).status == 204
            await asyncio.sleep(0)  # no wait this time: the kept connection may look open
            assert (await post(client, server.url())).status == 204
            assert len(server.heads) == 3

    run(test)


def test_what_is_not_http_and_what_ends_early_are_broken() -> None:
    async def test() -> None:
        holder: list[Server] = []
        async with Server(answering(lambda: holder[0], b"SSH-2.0-OpenSSH_9.2\r\n")) as server:
            holder.append(server)
            with pytest.raises(Broken, match="not HTTP"):
                await post(Client(), server.url())
        holder.clear()
        short = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nonly this"
        async with Server(answering(lambda: holder[0], short, then_close=True)) as server:
            holder.append(server)
            with pytest.raises(Broken, match="closed before the answer ended"):
                await post(Client(), server.url())

    run(test)


def test_nothing_listening_is_an_os_error() -> None:
    async def test() -> None:
        with pytest.raises(OSError):
            await post(Client(), "http://127.0.0.1:9/")

    run(test)


def test_a_deadline_closes_the_connection() -> None:
    async def test() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        async with Server(silent) as server:
            client = Client()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await post(client, server.url())
            assert not any(client._idle.values())

    run(test)


def test_a_target_is_escaped_and_the_host_header_is_the_urls() -> None:
    endpoint = Endpoint.of("https://user@Example.COM:8443/a b/ü?q=1 2&r=%20")
    assert (endpoint.tls, endpoint.host, endpoint.port) == (True, "example.com", 8443)
    assert endpoint.target == "/a%20b/%C3%BC?q=1%202&r=%20"
    assert endpoint.authority == "Example.COM:8443"
    assert Endpoint.of("http://[::1]/").authority == "[::1]" and Endpoint.of("http://[::1]/").port == 80


def test_an_idle_connection_that_speaks_unasked_is_not_reused() -> None:
    async def test() -> None:
        async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await holder[0].request(reader)
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")  # unasked, and the connection stays
            await writer.drain()
            await reader.read()

        holder: list[Server] = []
        async with Server(chatty) as server:
            holder.append(server)
            client = Client()
            assert (await post(client, server.url())).status == 204
            await asyncio.sleep(0.15)
            assert (await post(client, server.url())).status == 204  # on a new connection
            assert server.connections == 2

    run(test)
