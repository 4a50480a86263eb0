"""Faults under load: a service killed with SIGKILL, the database stopped and started, a worker that
dies mid-job, hostile strings. Afterwards the database is checked: nothing a client was told is done
is lost, and every job is eventually completed."""

import asyncio
import random
import signal
import time

import httpx
import pytest

from app.db import migrations
from tests.service_process import ServiceProcess
from tests.waiting import until

pytestmark = pytest.mark.anyio

LEASE = 2.0  # seconds: short, so jobs held by clients of a dead service come back soon


class Ledger:
    """What clients were told: enqueues and acks that got a 2xx."""

    def __init__(self) -> None:
        self.enqueued: set[int] = set()
        self.acked: set[int] = set()
        self.errors = 0

    async def produce(self, url: str, stop: asyncio.Event, queue: str = "load") -> None:
        async with httpx.AsyncClient(base_url=url(), timeout=5) as http:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    r = await http.post("/jobs", json={"queue": queue, "payload": n})
                    if r.status_code in (200, 201):
                        self.enqueued.add(r.json()["id"])
                    else:
                        self.errors += 1
                except httpx.TransportError:
                    self.errors += 1
                    await asyncio.sleep(0.05)
                    http.base_url = url()  # the service may be back on another port

    async def work(self, url, stop: asyncio.Event, queue: str = "load") -> None:
        async with httpx.AsyncClient(base_url=url(), timeout=5) as http:
            while not stop.is_set():
                try:
                    r = await http.post(
                        "/lease",
                        json={"queue": queue, "max_jobs": 5, "visibility_timeout": LEASE, "wait": 0.2},
                    )
                    if r.status_code != 200:
                        self.errors += 1
                        await asyncio.sleep(0.05)
                        continue
                    for job in r.json()["jobs"]:
                        if random.random() < 0.05:
                            continue  # this worker "crashes" on the job: it comes back after its lease
                        a = await http.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
                        if a.status_code == 200:
                            self.acked.add(job["id"])
                except httpx.TransportError:
                    self.errors += 1
                    await asyncio.sleep(0.05)
                    http.base_url = url()

    async def finish(self, url: str, db, queue: str = "load", timeout: float = 30) -> None:
        """Drain what is left, then check the ledger against the database."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            while True:
                left = await db.fetchval(
                    "SELECT count(*) FROM jobq.all_jobs WHERE queue = $1 AND status <> 'completed'", queue
                )
                if left == 0:
                    break
                assert time.monotonic() < deadline, f"{left} jobs never completed"
                r = await http.post("/lease", json={"queue": queue, "max_jobs": 100, "wait": 1})
                items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in r.json()["jobs"]]
                if items:
                    await http.post("/ack/batch", json={"items": items})
        rows = await db.fetch("SELECT id, status FROM jobq.all_jobs WHERE queue = $1", queue)
        status = {r["id"]: r["status"] for r in rows}
        assert self.enqueued, "the load produced nothing"
        assert self.enqueued <= status.keys(), "an enqueue that got a 2xx is missing"
        assert all(status[i] == "completed" for i in self.acked), "an ack that got a 2xx is not completed"
        assert set(status.values()) == {"completed"}


async def test_sigkill_of_the_service_under_load_loses_nothing(database_url, tmp_path, db):
    service = ServiceProcess(tmp_path, JOBQ_DATABASE_URL=database_url, JOBQ_SWEEP_INTERVAL="0.2").wait_ready()
    current = [service]
    ledger, stop = Ledger(), asyncio.Event()
    load = [asyncio.create_task(ledger.produce(lambda: current[0].url, stop)) for _ in range(4)]
    load += [asyncio.create_task(ledger.work(lambda: current[0].url, stop)) for _ in range(4)]
    try:
        await asyncio.sleep(1.5)
        before = len(ledger.enqueued)
        service.process.send_signal(signal.SIGKILL)
        service.process.wait()
        current[0] = ServiceProcess(tmp_path, JOBQ_DATABASE_URL=database_url, JOBQ_SWEEP_INTERVAL="0.2")
        await asyncio.to_thread(current[0].wait_ready)
        # The load resumes once its clients find the new service (a loaded machine takes its time).
        await until(lambda: len(ledger.enqueued) > before, timeout=20)
    finally:
        stop.set()
        await asyncio.gather(*load)
    try:
        await ledger.finish(current[0].url, db)
    finally:
        current[0].kill()


async def test_database_restart_under_load_loses_nothing(own_server, start_service):
    dsn = own_server.get_uri()
    await asyncio.to_thread(migrations.upgrade, dsn)
    service = start_service(database_url=dsn, pool_acquire_timeout=1.0, expire_interval=0.2)
    ledger, stop = Ledger(), asyncio.Event()
    load = [asyncio.create_task(ledger.produce(lambda: service.url, stop)) for _ in range(3)]
    load += [asyncio.create_task(ledger.work(lambda: service.url, stop)) for _ in range(3)]
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as http:
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(own_server.stop)
            r = await http.post("/jobs", json={"queue": "probe", "payload": 1})
            assert r.status_code == 503 and r.json()["code"] == "unavailable"
            assert (await http.get("/readyz")).json()["ready"] is False
            errors_while_down = ledger.errors
            await until(lambda: ledger.errors > errors_while_down, timeout=20)  # the load sees the outage

            def restart() -> None:
                with own_server._lock:
                    own_server.ensure_postgres_running()

            await asyncio.to_thread(restart)
            deadline = time.monotonic() + 20
            while (await http.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "the service did not recover"
                await asyncio.sleep(0.1)
            recovered = len(ledger.enqueued)
            await until(lambda: len(ledger.enqueued) > recovered, timeout=20)  # the load resumes
        finally:
            stop.set()
            await asyncio.gather(*load)
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await ledger.finish(service.url, conn)
    finally:
        await conn.close()


async def test_a_worker_that_dies_mid_job_gets_it_redelivered(client, db):
    await client.post("/jobs", json={"queue": "q", "payload": "work"})
    (first,) = (await client.post("/lease", json={"queue": "q", "visibility_timeout": 1})).json()["jobs"]
    # ...and the worker dies. Another worker waits for work:
    r = await client.post("/lease", json={"queue": "q", "wait": 5})
    (again,) = r.json()["jobs"]
    assert again["id"] == first["id"] and again["attempts"] == 2
    assert "lease expired" in again["last_error"]
    assert (
        await client.post("/ack", json={"id": again["id"], "lease_token": again["lease_token"]})
    ).status_code == 200
    row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs")
    assert (row["status"], row["attempts"]) == ("completed", 2)


INJECTIONS = [
    "'; DROP TABLE jobq.jobs; --",
    '" OR 1=1 --',
    "x'); DELETE FROM jobq.queues; --",
    "$1; SELECT pg_sleep(10)",
    "'||(SELECT version())||'",
    "\\'; TRUNCATE jobq.jobs; --",
]


async def test_sql_injection_in_every_string_field_is_stored_or_refused(client, db):
    for attack in INJECTIONS:
        # Queue names have a pattern: refused.
        r = await client.post("/jobs", json={"queue": attack, "payload": 1})
        assert r.status_code == 422
        assert (await client.get(f"/queues/{attack}")).status_code in (404, 422)
        # Everything else is data: stored verbatim.
        r = await client.post("/jobs", json={"queue": "q", "payload": {attack: attack}, "dedup_key": attack})
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["payload"] == {attack: attack} and job["dedup_key"] == attack
        (leased,) = (await client.post("/lease", json={"queue": "q", "worker_id": attack})).json()["jobs"]
        r = await client.post(
            "/nack", json={"id": leased["id"], "lease_token": leased["lease_token"], "error": attack}
        )
        assert r.status_code == 200
        bogus = await client.post("/ack", json={"id": leased["id"], "lease_token": attack})
        assert bogus.status_code == 409
        row = await db.fetchrow(
            "SELECT payload, dedup_key, last_error FROM jobq.all_jobs WHERE id = $1", job["id"]
        )
        assert (row["dedup_key"], row["last_error"]) == (attack, attack)
        assert (await client.get("/dead", params={"queue": attack})).status_code == 422
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == len(INJECTIONS)
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 1
