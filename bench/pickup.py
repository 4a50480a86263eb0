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

from app.db import sql as queries
from jobq import AsyncClient, Worker
from jobq.types import LeasedJob


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


async def wait_latency(waiter_url: str, worker_url: str, rounds: int) -> list[float]:
    """Waiting for a job across replicas: a waiter on one replica (`GET /jobs/{id}?wait=30`), the job
    leased and acked on the other; from the ack's request (its commit comes later) to the waiter's
    answer, so an upper bound on the delay after the commit."""
    latencies = []
    async with served.Session() as waiter, served.Session() as worker:
        for i in range(rounds):
            job = await served.post(worker, f"{worker_url}/jobs", {"queue": "waited", "payload": i})
            waiting = asyncio.create_task(waiter.get(f"{waiter_url}/jobs/{job['id']}?wait=30"))
            lease = {"queue": "waited", "wait": 5}  # a waiter marking the job may hold it a moment
            (leased,) = (await served.post(worker, f"{worker_url}/lease", lease))["jobs"]
            await asyncio.sleep(random.uniform(0.01, 0.03))  # the waiter is waiting by then
            started = time.perf_counter()
            ack = {"id": leased["id"], "lease_token": leased["lease_token"], "result": i}
            await served.post(worker, f"{worker_url}/ack", ack)
            status, body = await waiting
            latencies.append(time.perf_counter() - started)
            assert status == 200 and b'"completed"' in body, body
    return latencies


async def child_pickup(waiter_url: str, worker_url: str, rounds: int) -> list[float]:
    """A fan-in child across replicas (API part 6): a worker long-polls the child's queue on one replica
    while the child's three parents are leased and acked on the other; from the last parent's ack request
    to the long-poll's answer with the child (decided in that ack's transaction, the queue woken at its
    commit)."""
    latencies = []
    async with served.Session() as waiter, served.Session() as worker:
        for i in range(rounds):
            parents = [
                job["id"]
                for job in (
                    await served.post(
                        worker, f"{worker_url}/jobs/batch", {"jobs": [{"queue": "fan-in", "payload": i}] * 3}
                    )
                )["jobs"]
            ]
            child = await served.post(
                worker, f"{worker_url}/jobs", {"queue": "fan-in-child", "payload": i, "depends_on": parents}
            )
            leased = (await served.post(worker, f"{worker_url}/lease", {"queue": "fan-in", "max_jobs": 3}))[
                "jobs"
            ]
            assert len(leased) == 3, leased
            first, last = leased[:2], leased[2]
            items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in first]
            await served.post(worker, f"{worker_url}/ack/batch", {"items": items})
            lease = {"queue": "fan-in-child", "wait": 10}
            waiting = asyncio.create_task(served.post(waiter, f"{waiter_url}/lease", lease))
            await asyncio.sleep(random.uniform(0.01, 0.03))  # the long-poll is waiting by then
            started = time.perf_counter()
            await served.post(
                worker, f"{worker_url}/ack", {"id": last["id"], "lease_token": last["lease_token"]}
            )
            (got,) = (await waiting)["jobs"]
            latencies.append(time.perf_counter() - started)
            assert got["id"] == child["id"], got
            await served.post(
                waiter, f"{waiter_url}/ack", {"id": got["id"], "lease_token": got["lease_token"]}
            )
    return latencies


async def raw_wait_latency(dsn: str, rounds: int) -> list[float]:
    """The same path in bare asyncpg: a listener; the ack's UPDATE notifies the job's id at commit; on the
    notification the waiter reads the job."""
    listener, waiter, worker = [await asyncpg.connect(dsn) for _ in range(3)]
    await worker.execute("INSERT INTO jobq.queues (name) VALUES ('raw-waited') ON CONFLICT DO NOTHING")
    woken: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("raw_done", lambda *args: woken.put_nowait(args[-1]))
    latencies = []
    for i in range(rounds):
        job_id = await worker.fetchval(
            "INSERT INTO jobq.jobs (queue, payload, status) VALUES ('raw-waited', $1::jsonb, 'running')"
            " RETURNING id",
            str(i),
        )
        started = time.perf_counter()
        await worker.execute(
            "UPDATE jobq.jobs SET status = 'completed', result = $2::jsonb WHERE id = $1"
            " RETURNING pg_notify('raw_done', id::text)",
            job_id,
            str(i),
        )
        assert int(await woken.get()) == job_id
        await waiter.fetchrow(queries.GET_JOB.text, *queries.GET_JOB.args(id=job_id, scope=None))
        latencies.append(time.perf_counter() - started)
    for conn in (listener, waiter, worker):
        await conn.close()
    return latencies


async def hold_waits(url: str, ids: list[int]) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """One connection per job, each waiting for its job (`GET /jobs/{id}?wait=60`)."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for job_id in ids:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /jobs/{job_id}?wait=60 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        held.append((reader, writer))
    return held


async def answer_status(reader: asyncio.StreamReader) -> int:
    """The status of the HTTP answer `reader` has coming, its body read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
    )
    await reader.readexactly(length)
    return int(head[9:12])


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
