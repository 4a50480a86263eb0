"""jobq's side of the benchmarks: HTTP load from aiohttp (httpx would measure itself: it manages only
a few hundred requests a second from one core), bodies encoded and answers decoded with orjson (the
standard json module alone costs the client 2.6 ms per batch of 1,000 jobs, on the cores the service
and PostgreSQL need too)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

JSON = {"Content-Type": "application/json"}


def session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), headers=JSON)


async def post(http: aiohttp.ClientSession, url: str, body: object) -> dict:
    async with http.post(url, data=orjson.dumps(body)) as r:
        if r.status >= 300:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
        return orjson.loads(await r.read())


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
    """Workers long-poll and ack until `total` jobs are done (producers may still be running)."""
    done = 0
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

        await asyncio.gather(*(work() for _ in range(workers)))


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


async def sqs(http: aiohttp.ClientSession, url: str, action: str, body: dict) -> dict:
    """One call of jobq's Amazon SQS protocol (AWS JSON 1.0), unsigned: the service runs without tokens."""
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    async with http.post(f"{url}/", data=orjson.dumps(body), headers=headers) as r:
        if r.status >= 300:
            raise RuntimeError(f"{action}: {r.status} {await r.text()}")
        return orjson.loads(await r.read())


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
