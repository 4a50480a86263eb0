"""Finished jobs leave jobq.jobs for jobq.jobs_history, partitioned by day of purge_after, and retention
drops whole partitions (app/service/history.py): on a real database, through the service layer."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, timedelta

import asyncpg
import orjson
import pytest

from app import service
from app.core.errors import NotFound
from app.db import sql as q
from app.db.migrations import downgrade, upgrade
from app.db.pool import Database, pool_options
from app.service import history
from app.service.runtime import Runtime
from app.settings import Settings
from tests.helpers import open_database
from tests.service.calls import ack, enqueue, held, lease, lease_one, nack

pytestmark = pytest.mark.anyio

COLUMNS = ", ".join(q.JOB_COLUMNS)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    async with open_database(database_url, prune_batch=100) as database:
        yield database


@pytest.fixture
def runtime(database: Database) -> Runtime:
    """The Runtime of the operations that take one (enqueue, ack, configure_queue), on `database`."""
    return Runtime(database)


async def where(db: asyncpg.Connection, job_id: int) -> tuple[str, str] | None:
    """The table (a partition, for jobs_history) holding the job's row, and its status."""
    found = await db.fetchrow(
        """SELECT tableoid::regclass::text AS table, status FROM jobq.jobs WHERE id = $1
           UNION ALL SELECT tableoid::regclass::text, status FROM jobq.jobs_history WHERE id = $1""",
        job_id,
    )
    return (found["table"], found["status"]) if found else None


async def today(db: asyncpg.Connection) -> date:
    return await db.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date")


async def make_partition(db: asyncpg.Connection, day: date) -> None:
    await db.execute(
        f"CREATE TABLE jobq.{history.partition_name(day)} PARTITION OF jobq.jobs_history"
        f" FOR VALUES FROM ('{day} 00:00:00+00') TO ('{day + timedelta(days=1)} 00:00:00+00')"
    )


async def finished_rows(db: asyncpg.Connection, n: int, purge_after: str, queue: str = "old") -> None:
    """n completed jobs in jobs_history with this purge_after (an SQL expression)."""
    await db.execute(
        f"""INSERT INTO jobq.jobs_history (id, queue, status, payload, priority, run_at, attempts,
                                            created_at, updated_at, completed_at, awaited, purge_after)
            SELECT nextval('jobq.jobs_id_seq'), '{queue}', 'completed', '{{}}', 0, now(), 1, now(), now(),
                   now(), false, {purge_after}
            FROM generate_series(1, {n})"""
    )


async def test_finished_jobs_leave_jobs_for_jobs_history_in_the_same_statement(database, db, runtime):
    await service.configure_queue(runtime, "hourly", service.QueueSettings(retention=3600))
    done = await enqueue(runtime, "hourly")
    leased = await lease_one(runtime, "hourly")
    await ack(runtime, service.Ack(leased["id"], leased["lease_token"], result={"n": 1}))
    cancelled = await enqueue(runtime, "hourly")
    await service.cancel(database, cancelled["id"])
    dead = await enqueue(runtime, "hourly", max_attempts=1)
    await nack(runtime, await lease_one(runtime, "hourly"), error="boom")
    pending = await enqueue(runtime, "hourly")

    assert sorted(r["status"] for r in await db.fetch("SELECT status FROM jobq.jobs")) == ["dead", "pending"]
    kept = await db.fetch("SELECT id, status, purge_after - completed_at AS kept FROM jobq.jobs_history")
    assert sorted((r["id"], r["status"], r["kept"]) for r in kept) == [
        (done["id"], "completed", timedelta(hours=1)),
        (cancelled["id"], "cancelled", timedelta(hours=1)),
    ]
    # Every job is found wherever it is, the result with its job.
    got = {
        i: await service.get_job(database, i)
        for i in (done["id"], cancelled["id"], dead["id"], pending["id"])
    }
    assert [got[i]["status"] for i in got] == ["completed", "cancelled", "dead", "pending"]
    assert orjson.dumps(got[done["id"]]["result"]) == b'{"n": 1}'
    # A second ack of the same lease is answered from jobs_history, and changes nothing.
    assert (await ack(runtime, held(leased)))["id"] == done["id"]
    assert orjson.dumps((await service.get_job(database, done["id"]))["result"]) == b'{"n": 1}'
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history") == 2


async def test_a_job_is_gone_at_its_purge_after_before_its_partition_is(database, db, runtime):
    await service.configure_queue(runtime, "brief", service.QueueSettings(retention=0))
    job = await enqueue(runtime, "brief")
    await ack(runtime, held(await lease_one(runtime, "brief")))
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history WHERE id = $1", job["id"]) == 1
    with pytest.raises(NotFound):
        await service.get_job(database, job["id"])
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_the_partitions_each_retention_needs_are_made_a_day_ahead(database, db, runtime):
    await service.configure_queue(runtime, "weekly", service.QueueSettings(retention=7 * 86400))
    await service.configure_queue(runtime, "daily", service.QueueSettings(retention=86400))
    now = await db.fetchval("SELECT now() AT TIME ZONE 'UTC'")
    expected = {
        (now + timedelta(seconds=seconds, days=ahead)).date()
        for seconds in (7 * 86400, 86400)
        for ahead in (0, 1)
    }
    kept = await history.keep_history(database)
    assert set(kept.made) == expected == set(await history.partitions(database))
    assert (await history.keep_history(database)).made == []
    # Each job lands in the partition of the day of its purge_after.
    job = await enqueue(runtime, "weekly")
    await ack(runtime, held(await lease_one(runtime, "weekly")))
    purge_after = await db.fetchval("SELECT purge_after FROM jobq.jobs_history WHERE id = $1", job["id"])
    day = purge_after.astimezone(UTC).date()
    assert await where(db, job["id"]) == (f"jobq.{history.partition_name(day)}", "completed")


async def test_a_days_partition_is_dropped_whole_once_its_day_is_over(database, db):
    yesterday = await today(db) - timedelta(days=1)
    await make_partition(db, yesterday)
    await finished_rows(db, 5000, f"'{yesterday} 12:00:00+00'")
    await make_partition(db, await today(db) + timedelta(days=1))
    kept = await history.keep_history(database)
    assert kept.dropped == [yesterday]
    assert yesterday not in await history.partitions(database)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history") == 0
    # Nothing was deleted row by row: jobs_history has no dead tuples to vacuum.
    assert (
        await db.fetchval(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE 'jobs_history%'"
        )
        == 0
    )


@contextlib.asynccontextmanager
async def reading_history(database_url: str) -> AsyncIterator[None]:
    """A reader's transaction holding its lock on jobq.jobs_history until the block ends."""
    reader = await asyncpg.connect(database_url)
    try:
        async with reader.transaction():
            await reader.fetch("SELECT * FROM jobq.jobs_history LIMIT 1")
            yield
    finally:
        await reader.close()


async def test_a_drop_that_cannot_get_its_lock_gives_way_and_goes_next_round(
    database, db, database_url, runtime
):
    yesterday = await today(db) - timedelta(days=1)
    await make_partition(db, yesterday)
    async with reading_history(database_url):
        kept = await history.keep_history(database)
        assert kept.dropped == [] and yesterday in await history.partitions(database)
        # Acks go on meanwhile: the drop waits behind the reader no longer than its lock timeout.
        job = await enqueue(runtime)
        await ack(runtime, held(await lease_one(runtime)))
        assert (await service.get_job(database, job["id"]))["status"] == "completed"
    assert (await history.keep_history(database)).dropped == [yesterday]


async def test_a_make_that_cannot_get_its_lock_gives_way_and_goes_next_round(database, db, database_url):
    async with reading_history(database_url):
        kept = await history.keep_history(database)
        assert kept.made == [] and await history.partitions(database) == []
    assert len((await history.keep_history(database)).made) == 2


async def test_a_job_no_partition_takes_waits_in_the_default_partition_and_moves_when_its_day_comes(
    database, db, runtime
):
    await history.keep_history(database)
    # A queue's retention just changed to a month: its jobs have no partition until the next round.
    await service.configure_queue(runtime, "monthly", service.QueueSettings(retention=30 * 86400))
    job = await enqueue(runtime, "monthly")
    await ack(runtime, held(await lease_one(runtime, "monthly")))
    assert await where(db, job["id"]) == ("jobq.jobs_history_default", "completed")
    kept = await history.keep_history(database)
    assert len(kept.made) == 2
    table, status = await where(db, job["id"]) or ("", "")
    assert table.startswith("jobq.jobs_history_p") and status == "completed"
    assert (await service.get_job(database, job["id"]))["status"] == "completed"


async def test_the_default_partitions_rows_past_purge_after_are_deleted(database, db):
    await finished_rows(db, 250, "now() - interval '1 minute'")  # no partition of the past: the default
    await finished_rows(db, 3, "now() + interval '400 days'")  # nor of next year
    kept = await history.keep_history(database)
    assert kept.pruned == 250
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history_default") == 3


async def test_finished_jobs_still_in_jobs_are_moved_in_batches(database, db):
    """As an older release leaves them: completed and cancelled rows in jobq.jobs."""
    await db.execute("INSERT INTO jobq.queues (name, retention) VALUES ('old', 86400)")
    await db.execute(
        """INSERT INTO jobq.jobs (queue, status, payload, completed_at)
           SELECT 'old', CASE WHEN i % 2 = 0 THEN 'completed' ELSE 'cancelled' END, to_jsonb(i),
                  now() - CASE WHEN i <= 10 THEN interval '2 days' ELSE interval '1 hour' END
           FROM generate_series(1, 250) i"""
    )
    await db.execute("INSERT INTO jobq.jobs (queue, status, payload) VALUES ('old', 'pending', '1')")
    kept = await history.keep_history(database)
    assert kept.moved == 250
    assert [r["status"] for r in await db.fetch("SELECT status FROM jobq.jobs")] == ["pending"]
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history") == 240  # 10 past retention: gone
    assert (
        await db.fetchval(
            "SELECT count(*) FROM jobq.jobs_history WHERE purge_after <> completed_at + interval '1 day'"
        )
        == 0
    )


async def test_acks_go_on_while_partitions_come_and_go(database, db, runtime):
    """Three workers ack while retention rounds drop past days' partitions and make new ones: every ack
    succeeds and every job ends in jobs_history exactly once."""
    first = await today(db) - timedelta(days=6)
    for n in range(6):
        await make_partition(db, first + timedelta(days=n))
        await finished_rows(db, 2000, f"'{first + timedelta(days=n)} 12:00:00+00'")
    ids = [(await enqueue(runtime, payload=i))["id"] for i in range(400)]
    stop = asyncio.Event()

    async def work() -> int:
        done = 0
        while got := await lease(runtime, "q", max_jobs=10):
            for job in got:
                await ack(runtime, held(job))
                done += 1
        return done

    async def rounds() -> None:
        while not stop.is_set():
            await history.keep_history(database)
            await asyncio.sleep(0.01)

    keeper = asyncio.create_task(rounds())
    done = sum(await asyncio.gather(work(), work(), work()))
    stop.set()
    await keeper
    await history.keep_history(database)
    assert done == len(ids)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 0
    assert await db.fetchval(
        "SELECT count(DISTINCT id) FROM jobq.jobs_history WHERE status = 'completed' AND queue = 'q'"
    ) == len(ids)
    assert [d for d in await history.partitions(database) if d < await today(db)] == []


async def test_0016_leaves_finished_jobs_where_they_are_and_takes_them_back_going_down(database_url, db):
    await asyncio.to_thread(downgrade, database_url, "0015")
    assert await db.fetchval("SELECT to_regclass('jobq.jobs_history')") is None
    token = uuid.uuid4()
    await db.execute(
        "INSERT INTO jobq.jobs (queue, status, payload, completed_at, lease_token) VALUES"
        " ('q', 'completed', '1', now(), $1), ('q', 'pending', '2', NULL, NULL)",
        token,
    )
    # Up to 0016, which moves nothing, and on to the head, whose code moves them.
    await asyncio.to_thread(upgrade, database_url, "0016")
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 2
    await asyncio.to_thread(upgrade, database_url)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 2
    async with open_database(database_url) as database:
        assert (await history.keep_history(database)).moved == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history") == 1
    await asyncio.to_thread(downgrade, database_url, "0015")
    assert await db.fetchval("SELECT to_regclass('jobq.jobs_history')") is None
    rows = await db.fetch("SELECT status, lease_token FROM jobq.jobs ORDER BY id")
    assert [(r["status"], r["lease_token"]) for r in rows] == [("completed", token), ("pending", None)]
    await asyncio.to_thread(upgrade, database_url)


async def test_jit_is_off_on_the_services_connections(database_url):
    """The first executions of a job list among millions of finished jobs would be compiled (app/db/pool.py).
    On PostgreSQL itself, that is; through a pooler the server's setting applies (tests/system/
    test_pooler.py)."""
    conn = await asyncpg.connect(database_url, **pool_options(Settings(database_url=database_url)))
    try:
        assert await conn.fetchval("SHOW jit") == "off"
    finally:
        await conn.close()


async def test_acks_routed_to_the_default_partition_meanwhile_survive_its_days_partition_made(
    database, db, runtime
):
    """A day's partition is attached while acks insert rows of that very day, which until then go to the
    default partition: none of them fails. (Attaching alone locks jobs_history weakly, and an insert that
    chose the default partition before the attach committed then broke the default's new constraint.)"""
    queue_day = await today(db) + timedelta(days=40)
    rounds, acked = 20, 0
    for n in range(rounds):
        day = queue_day + timedelta(days=n)
        seconds = await db.fetchval(f"SELECT extract(epoch FROM '{day} 12:00:00+00'::timestamptz - now())")
        await service.configure_queue(runtime, f"r{n}", service.QueueSettings(retention=seconds))
        for _ in range(60):
            await enqueue(runtime, f"r{n}")
        stop = asyncio.Event()

        async def work(queue: str = f"r{n}") -> int:
            done = 0
            while not stop.is_set() and (got := await lease(runtime, queue, max_jobs=1)):
                await ack(runtime, held(got[0]))
                done += 1
            return done

        workers = [asyncio.create_task(work()) for _ in range(3)]
        await asyncio.sleep(0.01)
        made = await history._ddl(database, history._make(day))
        stop.set()
        acked += sum(await asyncio.gather(*workers))
        assert made
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs_history WHERE queue LIKE 'r%'") == acked > 0


async def test_a_job_stays_in_sight_while_its_days_partition_is_made(database, db, database_url, runtime):
    """Reads of a finished job in the default partition, made while its day's partition is being made,
    find it once the partition is there. (Attaching locked jobs_history weakly: a read took the list of
    partitions before the attach committed and its snapshot after, so it saw the row gone from the
    default partition and did not look in the new one.)"""
    await history.keep_history(database)
    await service.configure_queue(runtime, "monthly", service.QueueSettings(retention=30 * 86400))
    job = await enqueue(runtime, "monthly")
    await ack(runtime, held(await lease_one(runtime, "monthly")))
    assert await where(db, job["id"]) == ("jobq.jobs_history_default", "completed")
    day = await db.fetchval(
        "SELECT (purge_after AT TIME ZONE 'UTC')::date FROM jobq.jobs_history WHERE id = $1", job["id"]
    )

    async def lookup() -> str | None:
        reader = await asyncpg.connect(database_url)
        try:
            return await reader.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job["id"])
        finally:
            await reader.close()

    async def get() -> str:
        return (await service.get_job(database, job["id"]))["status"]

    maker = await asyncpg.connect(database_url)
    try:
        async with maker.transaction():
            for statement in history._make(day):
                await maker.execute(statement)
            reads = [asyncio.create_task(lookup()), asyncio.create_task(get())]
            waiting = """SELECT count(*) FROM pg_stat_activity
                         WHERE wait_event_type = 'Lock' AND datname = current_database()"""
            for _ in range(500):
                if await db.fetchval(waiting) == len(reads):
                    break
                await asyncio.sleep(0.01)
            assert await db.fetchval(waiting) == len(reads)
    finally:
        await maker.close()
    assert await asyncio.gather(*reads) == ["completed", "completed"]
    assert (await where(db, job["id"]) or ("", ""))[0] == f"jobq.{history.partition_name(day)}"
