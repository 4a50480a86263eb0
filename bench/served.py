"""jobq's side of the benchmarks: HTTP load from a small HTTP/1.1 client of our own (below), bodies
encoded and answers decoded with orjson.

The load generator shares the two cores with the service and PostgreSQL, so what it costs per request
is taken from them: httpx manages only a few hundred requests a second from one core, aiohttp about
100 us of CPU per request, the standard json module 2.6 ms per batch of 1,000 jobs. ``Session`` keeps
one keep-alive connection per concurrent caller, writes each request in one piece and reads the answer
by its Content-Length: a fraction of aiohttp's cost, as wrk or oha would be, so the figures measure the
service rather than its client.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import orjson

JSON = {"Content-Type": "application/json"}


class Session:
    """Keep-alive HTTP/1.1 connections to one host; each request takes a free connection or opens one."""

    def __init__(self) -> None:
        self._free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._all: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._all:
            writer.close()

    async def post(self, url: str, body: bytes, headers: dict[str, str] = JSON) -> tuple[int, bytes]:
        """POST `body` to `url`; the answer's status and body."""
        parts = urlsplit(url)
        if self._free:
            reader, writer = self._free.pop()
        else:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            self._all.append(writer)
        head = f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = await reader.readuntil(b"\r\n\r\n")
        status = int(answer[9:12])
        lines = answer.lower().split(b"\r\n")
        length = next(int(line[15:]) for line in lines if line.startswith(b"content-length:"))
        data = await reader.readexactly(length)
        self._free.append((reader, writer))
        return status, data


def session(connections: int) -> Session:
    """A Session; it opens as many connections as requests run at once (`connections` at most here)."""
    return Session()


async def post(http: Session, url: str, body: object) -> dict:
    status, data = await http.post(url, orjson.dumps(body))
    if status >= 300:
        raise RuntimeError(f"{url}: {status} {data.decode(errors='replace')}")
    return orjson.loads(data)


async def enqueue_single(url: str, queue: str, clients: int, total: int, payload: object) -> float:
    left = total
    async with session(clients) as http:

        async def work() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await post(http, f"{url}/jobs", {"queue": queue, "payload": payload})

        started = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(clients)))
        return time.perf_counter() - started


async def enqueue_batches(
    url: str, queue: str, batch: int, total: int, payload: object, clients: int = 1
) -> float:
    body = {"jobs": [{"queue": queue, "payload": payload}] * batch}
    left = total // batch
    async with session(clients) as http:

        async def work() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await post(http, f"{url}/jobs/batch", body)

        started = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(clients)))
        return time.perf_counter() - started


async def drain_count(url: str, queue: str, workers: int, batch: int, total: int) -> None:
    """Workers long-poll and ack until `total` jobs are done (producers may still be running). The
    workers still waiting in a long-poll then are called off, not waited for."""
    done = 0
    finished = asyncio.Event()
    async with session(workers) as http:

        async def work() -> None:
            nonlocal done
            while done < total:
                jobs = (await post(http, f"{url}/lease", {"queue": queue, "max_jobs": batch, "wait": 0.5}))[
                    "jobs"
                ]
                if len(jobs) == 1:
                    await post(
                        http, f"{url}/ack", {"id": jobs[0]["id"], "lease_token": jobs[0]["lease_token"]}
                    )
                elif jobs:
                    items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in jobs]
                    await post(http, f"{url}/ack/batch", {"items": items})
                done += len(jobs)
            finished.set()

        tasks = [asyncio.create_task(work()) for _ in range(workers)]
        await finished.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def drain(
    url: str, queue: str, workers: int, batch: int, stop_when_empty: bool = True
) -> tuple[int, float]:
    """Workers lease `batch` jobs and ack them (one /ack per job when batch is 1, else /ack/batch)."""
    done = 0
    async with session(workers) as http:

        async def work() -> None:
            nonlocal done
            while True:
                jobs = (await post(http, f"{url}/lease", {"queue": queue, "max_jobs": batch}))["jobs"]
                if not jobs:
                    if stop_when_empty:
                        return
                    continue
                if len(jobs) == 1:
                    await post(
                        http, f"{url}/ack", {"id": jobs[0]["id"], "lease_token": jobs[0]["lease_token"]}
                    )
                else:
                    items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in jobs]
                    await post(http, f"{url}/ack/batch", {"items": items})
                done += len(jobs)

        started = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(workers)))
        return done, time.perf_counter() - started


async def sqs(http: Session, url: str, action: str, body: dict) -> dict:
    """One call of jobq's Amazon SQS protocol (AWS JSON 1.0), unsigned: the service runs without tokens."""
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    status, data = await http.post(f"{url}/", orjson.dumps(body), headers)
    if status >= 300:
        raise RuntimeError(f"{action}: {status} {data.decode(errors='replace')}")
    return orjson.loads(data)


async def sqs_cycle(url: str, queue: str, total: int, clients: int = 4) -> float:
    """Send `total` messages in batches of 10, then receive and delete them 10 at a time; seconds."""
    async with session(clients) as http:
        queue_url = (await sqs(http, url, "CreateQueue", {"QueueName": queue}))["QueueUrl"]
        batches = total // 10
        left = batches
        started = time.perf_counter()

        async def send() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                entries = [{"Id": str(i), "MessageBody": '{"n": 1}'} for i in range(10)]
                await sqs(http, url, "SendMessageBatch", {"QueueUrl": queue_url, "Entries": entries})

        await asyncio.gather(*(send() for _ in range(clients)))
        done = 0

        async def receive() -> None:
            nonlocal done
            while done < total:
                answer = await sqs(
                    http, url, "ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": 10}
                )
                messages = answer.get("Messages", [])
                if not messages:
                    continue
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
                ]
                await sqs(http, url, "DeleteMessageBatch", {"QueueUrl": queue_url, "Entries": entries})
                done += len(messages)

        await asyncio.gather(*(receive() for _ in range(clients)))
        return time.perf_counter() - started


async def native_cycle(url: str, queue: str, total: int, clients: int = 4) -> float:
    """The same shape through jobq's own API: /jobs/batch of 10, then lease 10 + /ack/batch."""
    async with session(clients) as http:
        left = total // 10
        started = time.perf_counter()

        async def send() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await post(http, f"{url}/jobs/batch", {"jobs": [{"queue": queue, "payload": {"n": 1}}] * 10})

        await asyncio.gather(*(send() for _ in range(clients)))
        await drain_count(url, queue, clients, 10, total)
        return time.perf_counter() - started
