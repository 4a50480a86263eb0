"""Push delivery's benchmarks: a no-op endpoint that jobq pushes jobs to, and what is measured with it
(bench/run.py's `push` scenario).

The endpoint is a bare ASGI app served by uvicorn (httptools, as `jobq serve` runs) in the benchmark's
own process: it answers every POST with 204 once it has read the body, and notes when each request's
handler started. It checks no signature: what is measured is jobq's side of a delivery.

- drain: jobs per second of a queue whose backlog is delivered to the endpoint, from the moment its
  push target is set to the last job completed (bench/run.py compares it with the Python runner's drain
  of the same backlog, in the same run);
- pickup: from just before `POST /jobs` to the endpoint's handler starting, on an idle service, with
  20-120 ms idle at random between rounds.
"""

from __future__ import annotations

import asyncio
import random
import time

import orjson
import served
import uvicorn

PORT = 8913
URL = f"http://127.0.0.1:{PORT}/"


class Endpoint:
    """The no-op endpoint: `arrived` is called with each job's request time and body (a no-op unless a
    measurement sets it)."""

    def __init__(self) -> None:
        self.received = 0
        self.arrived = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.received += 1
        if self.arrived is not None:
            self.arrived(started, body)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def __aenter__(self) -> Endpoint:
        config = uvicorn.Config(
            self, host="127.0.0.1", port=PORT, http="httptools", log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # it could not start: say why
                raise RuntimeError(f"the push endpoint did not start (is {URL} in use?)")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await self._task


async def set_push(url: str, queue: str, concurrency: int | None) -> None:
    """Give the queue the endpoint as its push target, at `concurrency`; None takes the target away."""
    push = None if concurrency is None else {"url": URL, "concurrency": concurrency}
    async with served.Session() as http:
        status, body = await http.request(
            "PATCH", f"{url}/queues/{queue}", orjson.dumps({"push": push}), served.JSON
        )
    if status != 200:
        raise RuntimeError(f"push target not set: {status} {body!r}")


async def drain(url: str, endpoint: Endpoint, queue: str, concurrency: int, total: int, sql) -> float:
    """Jobs per second of push deliveries of `total` jobs already in `queue`, from setting its target
    to the last one completed; the target is taken away afterwards."""
    received = endpoint.received
    started = time.perf_counter()
    await set_push(url, queue, concurrency)
    while endpoint.received - received < total:
        await asyncio.sleep(0.005)
    while await sql("SELECT count(*) FROM jobq.jobs WHERE queue = $1", queue):
        await asyncio.sleep(0.005)
    took = time.perf_counter() - started
    await set_push(url, queue, None)
    return total / took


async def pickup(url: str, endpoint: Endpoint, rounds: int) -> list[float]:
    """Enqueue to the endpoint's handler starting, idle between rounds."""
    queue = "push-pickup"
    await set_push(url, queue, 16)
    sent: dict[int, float] = {}
    ran: asyncio.Queue[float] = asyncio.Queue()

    def arrived(at: float, body: bytes) -> None:
        ran.put_nowait(at - sent[orjson.loads(body)["payload"]])

    endpoint.arrived = arrived
    latencies = []
    try:
        async with served.Session() as producer:
            await asyncio.sleep(0.3)
            for i in range(rounds):
                await asyncio.sleep(random.uniform(0.02, 0.12))
                sent[i] = time.perf_counter()
                await served.post(producer, f"{url}/jobs", {"queue": queue, "payload": i})
                latencies.append(await asyncio.wait_for(ran.get(), 30))
    finally:
        endpoint.arrived = None
        await set_push(url, queue, None)  # later scenarios' services allow no push URL
    return latencies
