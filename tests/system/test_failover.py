"""Several database hosts in one URL (`postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write`, as
libpq and asyncpg write it): the pool, the LISTEN connection and migrations go to the first host that
answers and accepts writes; and a failover under load on pg_auto_failover (a monitor and two nodes with
synchronous replication), checked from the clients' own ledgers."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from app.db import migrations
from chaos.autofailover import AUTOCTL, PG_BIN, AutoFailoverCluster
from tests.fixtures import tool_missing
from tests.http.test_metrics import scrape, value
from tests.service_process import free_port
from tests.waiting import until

pytestmark = pytest.mark.anyio


def with_a_dead_host_first(dsn: str) -> str:
    """`dsn` with a host nobody listens on before its own."""
    parts = urlsplit(dsn)
    if not parts.hostname:
        pytest.skip("needs the tests' PostgreSQL on TCP (JOBQ_TEST_DATABASE_URL), not on a socket")
    user = f"{parts.username}@" if parts.username else ""
    hosts = f"127.0.0.1:{free_port()},{parts.hostname}:{parts.port or 5432}"
    query = "&".join(filter(None, [parts.query, "target_session_attrs=read-write"]))
    return urlunsplit(parts._replace(netloc=f"{user}{hosts}", query=query))


async def test_a_multi_host_url_serves_from_the_host_that_answers(database_url, start_service):
    dsn = with_a_dead_host_first(database_url)
    await asyncio.to_thread(migrations.upgrade, dsn)  # Alembic reaches it too (at head: nothing to do)
    service = start_service(database_url=dsn, listen_url=dsn, database_pool_mode="session")
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        waiting = asyncio.create_task(client.post("/lease", json={"queue": "q", "wait": 10}))
        await asyncio.sleep(0.3)
        r = await client.post("/jobs", json={"queue": "q", "payload": {"n": 1}})
        assert r.status_code == 201, r.text
        (job,) = (await waiting).json()["jobs"]
        assert job["id"] == r.json()["id"]
        assert value(await scrape(client), "jobq_listener_up") == 1.0


# --- failover on pg_auto_failover --------------------------------------------------------------------


@pytest.fixture
async def cluster() -> AsyncIterator[AutoFailoverCluster]:
    if AUTOCTL is None or not (PG_BIN / "pg_ctl").exists():
        packages = "pg-auto-failover-cli postgresql-15-auto-failover"
        tool_missing(f"pg_auto_failover is not installed (apt-get install {packages})")
    # Not under pytest's own temporary directory, which only its owner may enter.
    with tempfile.TemporaryDirectory(prefix="jobq-test-ha-", ignore_cleanup_errors=True) as root:
        os.chmod(root, 0o777)
        made = AutoFailoverCluster(Path(root), free_port)
        try:
            await made.up()
            yield made
        finally:
            await asyncio.to_thread(made.down)


# The service's settings for a database that fails over: connections in session mode, short waits for a
# connection and a statement (503 soon, not requests piling up), long-polls looking again every second.
HA_SETTINGS = {
    "database_pool_mode": "session",
    "pool_acquire_timeout": 1.0,
    "statement_timeout": 5.0,
    "wakeup_safety_interval": 1.0,
}


@dataclass
class Ledger:
    """What the producers and workers were told, each answer with its time."""

    enqueued: list[int] = field(default_factory=list)  # ids answered 201
    acked: list[tuple[int, str]] = field(default_factory=list)  # (job id, worker) answered 200
    statuses: Counter = field(default_factory=Counter)  # every answer's status
    problems: list[str] = field(default_factory=list)  # answers that break the contract
    enqueue_times: list[tuple[float, int]] = field(default_factory=list)  # (time, status)
    producing: asyncio.Event = field(default_factory=asyncio.Event)
    working: asyncio.Event = field(default_factory=asyncio.Event)

    def load(self, client: httpx.AsyncClient, queue: str, producers: int = 2, workers: int = 16) -> list:
        """Producers enqueueing and workers long-polling and acking, until `producing` and `working` are
        cleared; their tasks."""
        self.producing.set()
        self.working.set()
        tasks = [asyncio.create_task(self._produce(client, queue, n)) for n in range(producers)]
        return tasks + [asyncio.create_task(self._work(client, queue, f"w{n}")) for n in range(workers)]

    async def _produce(self, client: httpx.AsyncClient, queue: str, n: int) -> None:
        i = 0
        while self.producing.is_set():
            r = await client.post("/jobs", json={"queue": queue, "payload": {"producer": n, "i": i}})
            self.answer(r)
            self.enqueue_times.append((time.monotonic(), r.status_code))
            if r.status_code == 201:
                self.enqueued.append(r.json()["id"])
                i += 1
            else:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.005)

    async def _work(self, client: httpx.AsyncClient, queue: str, worker: str) -> None:
        while self.working.is_set():
            r = await client.post(
                "/lease", json={"queue": queue, "max_jobs": 3, "wait": 1, "worker_id": worker}
            )
            self.answer(r)
            if r.status_code != 200:
                await asyncio.sleep(0.1)
                continue
            for job in r.json()["jobs"]:
                r = await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
                self.answer(r)
                if r.status_code == 200:
                    self.acked.append((job["id"], worker))

    def serving_after(self, moment: float) -> Callable[[], float | None]:
        """A predicate: when the first enqueue answered 201 after `moment` was answered."""
        return lambda: next((t for t, s in self.enqueue_times if t > moment and s == 201), None)

    async def drain(self, dsn: str, tasks: list) -> dict[int, str]:
        """Producers stopped, the workers drain what is left (jobs held by leases lost with the old primary
        come back as their leases expire) and stop; every job's status, also those whose enqueue was
        answered 503 after its commit (a 503 without `nothing_done` may follow one): workers lease and ack
        those too."""
        self.producing.clear()
        db = await asyncpg.connect(dsn)
        try:
            await until(
                lambda: db.fetchval("SELECT count(*) = 0 FROM jobq.all_jobs WHERE status <> 'completed'"),
                timeout=60,
            )
            self.working.clear()
            await asyncio.gather(*tasks)
            rows = await db.fetch("SELECT id, status FROM jobq.all_jobs WHERE queue = 'ha'")
        finally:
            await db.close()
        return {row["id"]: row["status"] for row in rows}

    def check(self, statuses: dict[int, str]) -> None:
        """What a failover may not break, from the ledger and the jobs' statuses: no 500 (503 with
        Retry-After in the gap), every enqueue answered 201 exists, every ack answered 200 stays
        completed, no job acked under two leases, none lost."""
        assert self.problems == []
        assert set(self.statuses) <= {200, 201, 409, 503}, self.statuses
        assert self.statuses[503] > 0, "a gap was seen"
        assert set(self.enqueued) <= set(statuses), "every enqueue answered 201 exists"
        assert {statuses.get(job) for job, _ in self.acked} == {"completed"}
        acked = Counter(job for job, _ in self.acked)
        assert max(acked.values()) == 1, "no job acked under two leases"
        assert set(statuses.values()) == {"completed"}, "none lost"

    def answer(self, response: httpx.Response) -> None:
        self.statuses[response.status_code] += 1
        if response.status_code >= 500 and (
            response.status_code != 503 or "retry-after" not in response.headers
        ):
            self.problems.append(f"{response.request.url.path}: {response.status_code} {response.text[:200]}")


@pytest.mark.slow
async def test_failover_loses_no_acknowledged_enqueue_or_ack(cluster, start_service):
    """Mixed load (producers, 16 workers long-polling), then the primary's machine is lost (SIGKILL to
    its keeper and PostgreSQL) and the monitor promotes the standby. From the producers' and workers' own
    ledgers: every enqueue answered 201 exists, every ack answered 200 stays completed, no job is acked
    under two leases, none is lost; the service answers 503 with Retry-After in the gap, never 500, and
    serves again within 10 s of the promotion."""
    await asyncio.to_thread(migrations.upgrade, cluster.dsn)
    service = start_service(database_url=cluster.dsn, listen_url=cluster.dsn, **HA_SETTINGS)
    ledger = Ledger()
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.patch("/queues/ha", json={"visibility_timeout": 5})
        assert r.status_code == 200, r.text

        tasks = ledger.load(client, "ha")
        await asyncio.sleep(3)
        before = len(ledger.enqueued), len(ledger.acked)
        lost_at = time.monotonic()
        cluster.lose("node1")
        promoted = await until(lambda: cluster.reached({"node2": "wait_primary"}), timeout=90, every=0.1)
        promoted_at = time.monotonic()
        serving = await until(ledger.serving_after(promoted_at), timeout=30, every=0.05)
        await asyncio.sleep(3)  # more load on the new primary
        statuses = await ledger.drain(cluster.dsn, tasks)
    assert promoted
    assert before[0] > 0 and before[1] > 0, "load ran before the failover"
    ledger.check(statuses)
    assert serving - promoted_at <= 10
    print(
        f"failover: promoted {promoted_at - lost_at:.1f} s after the primary was lost, serving enqueues "
        f"again {serving - promoted_at:.1f} s after the promotion; {len(ledger.enqueued)} enqueues, "
        f"{len(ledger.acked)} acks ({len(set(statuses) - set(ledger.enqueued))} jobs committed under a 503), "
        f"answers {dict(ledger.statuses)}"
    )


async def test_lists_and_statistics_read_the_standby(cluster, start_service):
    """JOBQ_READ_DATABASE_URL names the standby: the lists and the queues' statistics are read there
    (they show what replication brought), while leases, acks and a job's own state go to the primary."""
    await asyncio.to_thread(migrations.upgrade, cluster.dsn)
    standby = f"postgresql://postgres@127.0.0.1:{cluster.ports['node2']}/jobq"
    service = start_service(
        database_url=cluster.dsn,
        listen_url=cluster.dsn,
        database_pool_mode="session",
        read_database_url=standby,
    )
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        ids = [
            (await client.post("/jobs", json={"queue": "r", "payload": {"n": n}})).json()["id"]
            for n in range(3)
        ]
        r = await client.post("/lease", json={"queue": "r", "max_jobs": 1})
        (job,) = r.json()["jobs"]
        assert (
            await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
        ).status_code == 200
        assert (await client.get(f"/jobs/{job['id']}")).json()["status"] == "completed"

        async def listed() -> bool:
            page = (await client.get("/jobs", params={"queue": "r"})).json()["jobs"]
            return sorted(j["id"] for j in page) == sorted(ids) and {j["status"] for j in page} == {
                "completed",
                "pending",
            }

        await until(listed, timeout=10)
        (row,) = (await client.get("/queues")).json()
        assert (row["queue"], row["pending"]) == ("r", 2)
    conn = await asyncpg.connect(standby)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()")
        queries = await conn.fetch(
            "SELECT query FROM pg_stat_activity WHERE application_name = 'jobq' AND datname = 'jobq'"
        )
    finally:
        await conn.close()
    assert queries, "the service's read pool is connected to the standby"
