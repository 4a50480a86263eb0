"""SQS DeleteQueue racing enqueues: a job never outlives its queue row (lease, expiry and pruning all
join it, so such a job would never be seen again). Enqueues take a shared advisory lock on their queue,
DeleteQueue the exclusive one before it deletes (app/db/sql/queues.py, LOCK_QUEUE)."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import httpx
import pytest

from tests.waiting import until

pytestmark = pytest.mark.anyio

ORPHANS = (
    "SELECT count(*) FROM jobq.all_jobs j WHERE NOT EXISTS (SELECT FROM jobq.queues q WHERE q.name = j.queue)"
)
WAITING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE application_name = 'jobq' AND datname = current_database() AND wait_event_type = 'Lock'"
)


async def sqs(http: httpx.AsyncClient, action: str, **body: object) -> httpx.Response:
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    return await http.post("/", content=json.dumps(body), headers=headers)


async def leasable(http: httpx.AsyncClient, queue: str) -> set[int]:
    ids: set[int] = set()
    while jobs := (await http.post("/lease", json={"queue": queue, "max_jobs": 1000})).json()["jobs"]:
        ids |= {j["id"] for j in jobs}
    return ids


async def test_delete_queue_waits_for_an_enqueue_in_flight(service, db, database_url):
    """An application's transaction has enqueued into the queue and not committed yet: DeleteQueue waits
    for it, then deletes its job too. An enqueue arriving meanwhile waits for the delete, then creates
    the queue again, and its job is leasable."""
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        url = (await sqs(http, "CreateQueue", QueueName="doomed")).json()["QueueUrl"]
        assert (await sqs(http, "SendMessage", QueueUrl=url, MessageBody="before")).status_code == 200
        application = await asyncpg.connect(database_url)
        try:
            async with application.transaction():
                await application.fetchval("""SELECT jobq.enqueue('doomed', '"in flight"')""")
                delete = asyncio.create_task(sqs(http, "DeleteQueue", QueueUrl=url))
                await until(lambda: db.fetchval(WAITING), timeout=5)  # the delete waits for this transaction
                later = asyncio.create_task(http.post("/jobs", json={"queue": "doomed", "payload": "after"}))
                # ...and the enqueue that came after waits for the delete.
                await until(lambda: db.fetchval(f"SELECT ({WAITING}) = 2"))
                assert not delete.done() and not later.done()
        finally:
            await application.close()
        assert (await delete).status_code == 200
        after = await later
        assert after.status_code == 201
        assert await db.fetchval(ORPHANS) == 0
        assert await db.fetchval("SELECT array_agg(payload #>> '{}') FROM jobq.all_jobs") == ["after"]
        assert await leasable(http, "doomed") == {after.json()["id"]}


async def test_many_enqueues_racing_deletes_leave_no_orphan(service, db, database_url):
    """HTTP enqueues (single and batch) and SQL enqueues on connections of their own, all into one queue,
    while it is deleted again and again. Afterwards no job lacks its queue row, and every job enqueued
    after the last delete answered is there and leasable."""
    queue, stop = "race", asyncio.Event()
    enqueued: list[tuple[float, list[int]]] = []  # (when the request started, the ids answered)

    async def over_http(http: httpx.AsyncClient, batch: bool) -> None:
        while not stop.is_set():
            started = time.monotonic()
            if batch:
                jobs = [{"queue": queue, "payload": i} for i in range(20)]
                r = await http.post("/jobs/batch", json={"jobs": jobs})
                assert r.status_code == 201, r.text
                enqueued.append((started, [j["id"] for j in r.json()["jobs"]]))
            else:
                r = await http.post("/jobs", json={"queue": queue, "payload": "one"})
                assert r.status_code == 201, r.text
                enqueued.append((started, [r.json()["id"]]))

    async def over_sql(conn: asyncpg.Connection) -> None:
        while not stop.is_set():
            started = time.monotonic()
            async with conn.transaction():
                job_id = await conn.fetchval("SELECT jobq.enqueue($1, '\"sql\"')", queue)
            enqueued.append((started, [job_id]))

    connections = [await asyncpg.connect(database_url) for _ in range(3)]
    try:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            url = (await sqs(http, "CreateQueue", QueueName=queue)).json()["QueueUrl"]
            producers = [asyncio.create_task(over_http(http, batch=k % 2 == 1)) for k in range(8)]
            producers += [asyncio.create_task(over_sql(conn)) for conn in connections]
            for _ in range(8):
                await until(lambda: len(enqueued) >= 20)
                enqueued_before = len(enqueued)
                r = await sqs(http, "DeleteQueue", QueueUrl=url)
                assert r.status_code in (200, 400), r.text  # 400: gone already, not created again yet
                deleted_at = time.monotonic()
                await until(lambda n=enqueued_before: len(enqueued) >= n + 20)
            await until(lambda: sum(started > deleted_at for started, _ in enqueued) >= 30)
            stop.set()
            await asyncio.gather(*producers)
            assert await db.fetchval(ORPHANS) == 0
            existing = {
                r["id"] for r in await db.fetch("SELECT id FROM jobq.all_jobs WHERE queue = $1", queue)
            }
            after_delete = {i for started, ids in enqueued if started > deleted_at for i in ids}
            assert after_delete <= existing
            assert await leasable(http, queue) == existing
    finally:
        for conn in connections:
            await conn.close()
