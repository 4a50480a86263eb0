"""jobq behind a connection pooler in transaction mode (JOBQ_DATABASE_POOL_MODE=transaction), with LISTEN,
migrations and maintenance on a session of their own (JOBQ_LISTEN_URL), and what happens while that
session cannot be made. The whole suite runs this way too: JOBQ_TEST_POOLER=pgbouncer (tests/fixtures.py),
which .ci/run does."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from app.db.pool import PooledConnection, pool_options
from app.service.loops import vacuum as maintenance
from app.settings import Settings
from tests.helpers import ADVISORY_LOCKS_HERE, open_database
from tests.http.test_metrics import scrape, value
from tests.pgbouncer import through_pooler
from tests.service_process import free_port

pytestmark = pytest.mark.anyio


def test_transaction_mode_needs_a_session_for_listen():
    with pytest.raises(ValidationError, match="needs JOBQ_LISTEN_URL"):
        Settings(database_url="postgresql://pooler/db", database_pool_mode="transaction")
    with pytest.raises(ValidationError):
        Settings(database_url="postgresql://pooler/db", database_pool_mode="statement")


async def test_a_session_setting_is_refused_by_the_pooler_and_jobq_sends_none(pgbouncer, database_url):
    """What the transaction mode is for: PgBouncer refuses the statement timeout jobq sends at connect on
    PostgreSQL itself, and the service in transaction mode works through it, from enqueue to ack."""
    pooled = through_pooler(database_url, pgbouncer)
    with pytest.raises(asyncpg.ProtocolViolationError, match="statement_timeout"):
        await asyncpg.connect(pooled, server_settings={"statement_timeout": "1000"})


async def test_the_service_through_pgbouncer(pgbouncer, database_url, start_service, db):
    pooled = through_pooler(database_url, pgbouncer)
    service = start_service(
        database_url=pooled, listen_url=database_url, database_pool_mode="transaction", pool_max_size=4
    )
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        waiting = asyncio.create_task(client.post("/lease", json={"queue": "q", "wait": 10, "max_jobs": 5}))
        await asyncio.sleep(0.3)  # the long-poll is waiting: the enqueue's NOTIFY wakes it, through LISTEN
        started = time.monotonic()
        r = await client.post(
            "/jobs/batch", json={"jobs": [{"queue": "q", "payload": {"n": n}} for n in range(5)]}
        )
        assert r.status_code == 201, r.text
        leased = (await waiting).json()["jobs"]
        assert time.monotonic() - started < 5  # woken, not the end of its wait
        assert {job["payload"]["n"] for job in leased} == set(range(5))
        for job in leased:
            r = await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
            assert r.status_code == 200, r.text
        # Many calls at once, more than the pool's connections: statements of different clients share
        # PgBouncer's server sessions, one transaction at a time.
        answers = await asyncio.gather(
            *(client.post("/jobs", json={"queue": "many", "payload": {"n": n}}) for n in range(40))
        )
        assert {a.status_code for a in answers} == {201}
        samples = await scrape(client)
        assert value(samples, "jobq_listener_up") == 1.0
    completed = await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'completed'")
    assert completed == len(leased)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'many'") == 40
    # The listener is a session of its own, to PostgreSQL itself.
    names = await db.fetch("SELECT application_name FROM pg_stat_activity WHERE datname = current_database()")
    assert "jobq-listener" in {n["application_name"] for n in names}


async def test_type_lookups_through_the_pooler_stay_on_one_session(pgbouncer, database_url, monkeypatch):
    """asyncpg looks a type up the first time a statement uses it, turning JIT off for the session around
    the lookup (compiled, it takes a second: longer than a short statement timeout). Through the pooler
    the three statements run in one transaction, so on one server session, and JIT is back as it was."""
    pooled = through_pooler(database_url, pgbouncer)
    settings = Settings(database_url=pooled, listen_url=database_url, database_pool_mode="transaction")
    options = pool_options(settings)
    assert options["connection_class"] is PooledConnection
    lookups: list[bool] = []
    lookup = asyncpg.Connection._introspect_types

    async def spy(self: asyncpg.Connection, typeoids: object, timeout: object) -> object:
        lookups.append(self.is_in_transaction())
        return await lookup(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", spy)
    server = await asyncpg.connect(database_url)
    conn = await asyncpg.connect(pooled, **options)
    try:
        assert await conn.fetchval("SELECT $1::int8[]", [1, 2]) == [1, 2]
        assert await conn.fetchval("SELECT $1::date[]", []) == []
        assert lookups == [True, True]
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SHOW jit") == await server.fetchval("SHOW jit")
        async with conn.transaction():  # within a transaction of its own: no savepoint needed
            assert await conn.fetchval("SELECT $1::float8[]", [0.5]) == [0.5]
        assert lookups == [True, True, True]
    finally:
        await conn.close()
        await server.close()


async def test_maintenance_vacuums_on_a_session_of_its_own(pgbouncer, database_url, db):
    """The maintenance lock and VACUUM need a session: through the pooler they run on JOBQ_LISTEN_URL."""
    await db.execute("INSERT INTO jobq.queues (name) VALUES ('v')")
    await db.execute("INSERT INTO jobq.jobs (queue, payload) SELECT 'v', '{}' FROM generate_series(1, 3000)")
    await db.execute("DELETE FROM jobq.jobs")
    await db.execute("SELECT pg_stat_force_next_flush()")
    pooled = through_pooler(database_url, pgbouncer)
    async with open_database(pooled, listen_url=database_url, database_pool_mode="transaction") as database:
        assert database.session_url == database_url
        assert await maintenance.vacuum_if_needed(database)
        await db.execute("SELECT pg_stat_force_next_flush()")
        dead = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass"
        assert await db.fetchval(dead) == 0
        # The session lock went with its session: nothing holds it, and the next check takes it again.
        assert await db.fetchval(ADVISORY_LOCKS_HERE) == 0
        assert await maintenance.vacuum_if_needed(database) is False  # nothing left to do


async def test_with_the_listen_connection_down_long_polls_poll(database_url, start_service):
    """LISTEN's connection cannot be made: the service starts at once, says so in `jobq_listener_up`, and
    a waiting long-poll finds a new job by the safety poll, long before its wait is over."""
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/jobq"
    started = time.monotonic()
    service = start_service(listen_url=nowhere, wakeup_safety_interval=0.3)
    assert time.monotonic() - started < 5
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        samples = await scrape(client)
        assert value(samples, "jobq_listener_up") == 0.0
        for n in range(3):
            waiting = asyncio.create_task(client.post("/lease", json={"queue": "q", "wait": 20}))
            await asyncio.sleep(0.1)
            sent = time.monotonic()
            r = await client.post("/jobs", json={"queue": "q", "payload": {"n": n}})
            assert r.status_code == 201
            (job,) = (await waiting).json()["jobs"]
            assert job["payload"] == {"n": n}
            assert time.monotonic() - sent < 3  # the safety poll, every 0.3 s; not the 20 s wait
