"""An HTTP endpoint of the test's own for push deliveries: it serves on 127.0.0.1 in the test's event loop,
records every request it gets (headers, body, when) and answers each path as the test says."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

Answer = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def job(self) -> dict:
        return orjson.loads(self.body)


async def ok(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.Response(status=204)


@dataclass
class Endpoint:
    answers: dict[str, Answer] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str, answer: Answer) -> str:
        """Answer requests to `path` with `answer`; the URL to push to."""
        self.answers[path] = answer
        return self.url(path)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            body = await request.read()
            self.received.append(Received(request.path, dict(request.headers), body, time.monotonic()))
            self._arrived.set()
            return await self.answers.get(request.path, ok)(request, body)
        finally:
            self.in_flight -= 1

    async def start(self) -> Endpoint:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        # Stopped, it cancels the handlers still answering (a deliberately slow one, which the service
        # gave up on long ago) after a moment, rather than wait out the 60 s aiohttp gives them.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def wait_for(self, path: str, n: int, timeout: float = 10.0) -> list[Received]:
        """The first `n` requests to `path`, once they have arrived (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while len(self.at(path)) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(self.at(path))} of {n} requests to {path} arrived in {timeout} s"
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                pass
        return self.at(path)[:n]
