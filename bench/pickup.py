"""Pickup latency: enqueue to delivery for an idle long-polling worker, and what waiting costs.

    .venv/bin/python bench/pickup.py [--rounds 200]

- jobq: a worker waits in `POST /lease` (wait=30); a producer `POST /jobs`; the time from just before
  the enqueue to the worker holding the job. p50 and p99.
- raw limit, same run: the same path in bare asyncpg (a listener connection; the producer inserts and
  NOTIFYs; on the notification the worker runs the claim statement).
- waiting: the service's RSS idle and with 1,000 concurrent long-polls, and its database connections.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import asyncpg
import served
from common import Service, fresh_database, summary_ms, write_results

from app import queries
from jobq import AsyncClient, LeasedJob, Worker


async def jobq_pickup(url: str, rounds: int) -> list[float]:
    latencies = []
    async with served.Session() as worker, served.Session() as producer:
        for i in range(rounds):
            waiting = asyncio.create_task(
                served.post(worker, f"{url}/lease", {"queue": "pickup", "wait": 30})
            )
            await asyncio.sleep(0.02)
            started = time.perf_counter()
            await served.post(producer, f"{url}/jobs", {"queue": "pickup", "payload": i})
            (job,) = (await waiting)["jobs"]
            latencies.append(time.perf_counter() - started)
            await served.post(worker, f"{url}/ack", {"id": job["id"], "lease_token": job["lease_token"]})
    return latencies


async def runner_pickup(url: str, rounds: int) -> list[float]:
    """The same through the worker runner (`jobq.Worker`, 16 slots, idle in this process): from just before
    the enqueue to the handler starting, with 20-120 ms idle at random between rounds (a fixed gap would
    phase-lock onto anything periodic)."""
    started: dict[int, float] = {}
    ran: asyncio.Queue[float] = asyncio.Queue()

    async def handler(job: LeasedJob) -> None:
        ran.put_nowait(time.perf_counter() - started[job.payload])

    latencies = []
    async with AsyncClient(url) as client, served.Session() as producer:
        worker = Worker(handler, "runner-pickup", client=client, concurrency=16, wait=20)
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)
        for i in range(rounds):
            await asyncio.sleep(random.uniform(0.02, 0.12))
            started[i] = time.perf_counter()
            await served.post(producer, f"{url}/jobs", {"queue": "runner-pickup", "payload": i})
            latencies.append(await asyncio.wait_for(ran.get(), 30))
        worker.stop()
        await run
    return latencies


async def raw_pickup(dsn: str, rounds: int) -> list[float]:
    listener = await asyncpg.connect(dsn)
    worker = await asyncpg.connect(dsn)
    producer = await asyncpg.connect(dsn)
    await producer.execute("INSERT INTO jobq.queues (name) VALUES ('raw') ON CONFLICT DO NOTHING")
    woken: asyncio.Queue[None] = asyncio.Queue()
    await listener.add_listener("raw", lambda *args: woken.put_nowait(None))
    claim = queries.LEASE.text
    args = queries.LEASE.args(queue="raw", visibility_timeouts=[None], worker_ids=[None])
    latencies = []
    for i in range(rounds):
        started = time.perf_counter()
        await producer.execute(
            "WITH j AS (INSERT INTO jobq.jobs (queue, payload) VALUES ('raw', $1::jsonb) RETURNING id)"
            " SELECT pg_notify('raw', id::text) FROM j",
            str(i),
        )
        await woken.get()
        rows = await worker.fetch(claim, *args)
        latencies.append(time.perf_counter() - started)
        assert len(rows) == 1
    for conn in (listener, worker, producer):
        await conn.close()
    return latencies


async def hold_long_polls(url: str, count: int) -> list[asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    body = b'{"queue": "idle", "wait": 60}'
    request = (
        b"POST /lease HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        writers.append(writer)
    return writers


async def main(rounds: int) -> None:
    async with fresh_database() as dsn, Service(dsn) as service:
        raw = await raw_pickup(dsn, rounds)
        jobq = await jobq_pickup(service.url, rounds)

        idle_rss = service.rss_mb()
        writers = await hold_long_polls(service.url, 1000)
        await asyncio.sleep(3)
        waiting_rss = service.rss_mb()
        conn = await asyncpg.connect(dsn)
        connections = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'jobq%'"
        )
        await conn.close()
        for writer in writers:
            writer.close()

    results = {
        "pickup": {"jobq": summary_ms(jobq), "raw_sql": summary_ms(raw)},
        "waiting_1000": {
            "rss_idle_mb": round(idle_rss, 1),
            "rss_waiting_mb": round(waiting_rss, 1),
            "rss_added_mb": round(waiting_rss - idle_rss, 1),
            "database_connections": connections,
        },
    }
    j, r = results["pickup"]["jobq"], results["pickup"]["raw_sql"]
    print(f"{'pickup (enqueue -> delivery)':32} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'jobq over HTTP':32} {j['p50_ms']:8.2f} {j['p99_ms']:8.2f}")
    print(f"{'raw asyncpg NOTIFY + claim':32} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}")
    print(f"{'ratio jobq / raw (p50)':32} {j['p50_ms'] / r['p50_ms']:8.2f}")
    w = results["waiting_1000"]
    print(
        f"1,000 waiting long-polls: RSS {w['rss_idle_mb']} -> {w['rss_waiting_mb']} MB "
        f"(+{w['rss_added_mb']} MB), {w['database_connections']} database connections"
    )
    print("written to", write_results("pickup", results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    asyncio.run(main(parser.parse_args().rounds))
