"""Enqueue from SQL, inside the application's own transaction (jobq.enqueue)."""

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from app.db.migrations import downgrade, upgrade

pytestmark = pytest.mark.anyio


async def test_rolled_back_enqueue_never_appears(db, client):
    with pytest.raises(RuntimeError):
        async with db.transaction():
            job_id = await db.fetchval("SELECT jobq.enqueue('orders', '{\"order\": 1}'::jsonb)")
            assert job_id is not None
            raise RuntimeError("the application's own write failed")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0
    r = await client.post("/lease", json={"queue": "orders"})
    assert r.json() == {"jobs": []}


async def test_committed_enqueue_is_leased_over_http(db, client):
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    async with db.transaction():
        await db.execute("INSERT INTO orders VALUES (7)")
        job_id = await db.fetchval(
            "SELECT jobq.enqueue('orders', jsonb_build_object('order', 7), priority => 3, max_attempts => 2)"
        )
    r = await client.post("/lease", json={"queue": "orders"})
    (job,) = r.json()["jobs"]
    assert job["id"] == job_id
    assert job["payload"] == {"order": 7}
    assert job["priority"] == 3 and job["max_attempts"] == 2 and job["attempts"] == 1
    r = await client.post("/ack", json={"id": job_id, "lease_token": job["lease_token"]})
    assert r.status_code == 200
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job_id) == "completed"


async def test_sql_enqueue_options_and_dedup(db, client):
    first = await db.fetchval(
        "SELECT jobq.enqueue('mail', 'null', run_at => now() + interval '1 hour', dedup_key => 'welcome-1')"
    )
    again = await db.fetchval("SELECT jobq.enqueue('mail', '{}', dedup_key => 'welcome-1')")
    assert again == first
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 1
    r = await client.get(f"/jobs/{first}")
    assert r.json()["payload"] is None and r.json()["status"] == "pending"
    queue = (await client.get("/queues/mail")).json()
    assert queue["scheduled"] == 1 and queue["pending"] == 0


async def test_sql_enqueue_rejects_bad_queue_names(db):
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("SELECT jobq.enqueue('no spaces', '{}')")


async def test_sql_enqueue_refuses_an_infinite_run_at_and_those_written_before_are_made_finite(
    database_url, db, client
):
    """PostgreSQL's infinities have no Python datetime: shown without an offset, and GET /queues could not
    subtract them. Revision 0017 moves the ones it finds to finite ends, as early or as late."""
    for run_at in ["infinity", "-infinity"]:
        with pytest.raises(asyncpg.CheckViolationError, match="ck_jobs_run_at_finite"):
            await db.execute(f"SELECT jobq.enqueue('q', '1', run_at => '{run_at}')")
    await asyncio.to_thread(downgrade, database_url, "0016")
    await db.execute(
        "SELECT jobq.enqueue('q', '1', run_at => '-infinity'), jobq.enqueue('q', '2', run_at => 'infinity')"
    )
    await asyncio.to_thread(upgrade, database_url)
    rows = await db.fetch("SELECT payload::int AS n, run_at FROM jobq.jobs ORDER BY id")
    assert [(r["n"], r["run_at"]) for r in rows] == [
        (1, datetime(1970, 1, 1, tzinfo=UTC)),
        (2, datetime(9999, 12, 31, tzinfo=UTC)),
    ]
    r = await client.get("/queues/q")
    assert r.status_code == 200, r.text
    assert r.json()["pending"] == 1 and r.json()["scheduled"] == 1


async def test_sql_enqueue_with_kind_is_shown_over_http(db, client):
    named = await db.fetchval("SELECT jobq.enqueue('mail', '{}', kind => 'send_email')")
    # Positionally, after every older parameter.
    positional = await db.fetchval("SELECT jobq.enqueue('mail', '{}', 0, NULL, NULL, NULL, 'send.sms:v2')")
    plain = await db.fetchval("SELECT jobq.enqueue('mail', '{}')")
    rows = await db.fetch("SELECT id, kind FROM jobq.all_jobs ORDER BY id")
    assert [(r["id"], r["kind"]) for r in rows] == [
        (named, "send_email"),
        (positional, "send.sms:v2"),
        (plain, None),
    ]
    assert (await client.get(f"/jobs/{named}")).json()["kind"] == "send_email"
    assert (await client.get(f"/jobs/{plain}")).json()["kind"] is None
    leased = (await client.post("/lease", json={"queue": "mail", "max_jobs": 3})).json()["jobs"]
    assert {j["id"]: j["kind"] for j in leased} == {
        named: "send_email",
        positional: "send.sms:v2",
        plain: None,
    }


async def test_sql_enqueue_calls_written_before_kind_still_resolve(db):
    """Every way of calling the function before it took `kind` runs as before: one function, no overload
    that would make a call ambiguous."""
    assert await db.fetchval("SELECT count(*) FROM pg_proc WHERE proname = 'enqueue'") == 1
    calls = [
        "SELECT jobq.enqueue('a', '1')",
        "SELECT jobq.enqueue('a', '2', 5)",
        "SELECT jobq.enqueue('a', '3', 5, now() + interval '1 hour')",
        "SELECT jobq.enqueue('a', '4', 5, NULL, 3)",
        "SELECT jobq.enqueue('a', '5', 5, NULL, 3, 'key-5')",
        "SELECT jobq.enqueue(queue => 'a', payload => '6', dedup_key => 'key-6', max_attempts => 2)",
    ]
    ids = [await db.fetchval(call) for call in calls]
    assert len(set(ids)) == len(calls)
    rows = await db.fetch("SELECT priority, max_attempts, dedup_key, kind FROM jobq.all_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [
        (0, None, None, None),
        (5, None, None, None),
        (5, None, None, None),
        (5, 3, None, None),
        (5, 3, "key-5", None),
        (0, 2, "key-6", None),
    ]
    # Dedup answers with the holder, as before.
    assert await db.fetchval("SELECT jobq.enqueue('a', '7', dedup_key => 'key-6', kind => 'k')") == ids[-1]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == len(calls)


@pytest.mark.parametrize("kind", ["", "x" * 129, "has space", "a/b", "ünïcode", "k\n"])
async def test_sql_enqueue_rejects_bad_kinds(db, kind):
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("SELECT jobq.enqueue('q', '{}', kind => $1)", kind)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0
    assert await db.fetchval("SELECT jobq.enqueue('q', '{}', kind => $1)", "x" * 128) is not None


async def test_sql_enqueue_with_key(db, client):
    named = await db.fetchval("SELECT jobq.enqueue('mail', '{}', key => 'customer-42')")
    positional = await db.fetchval("SELECT jobq.enqueue('mail', '{}', 0, NULL, NULL, NULL, 'send', 'tenant')")
    plain = await db.fetchval("SELECT jobq.enqueue('mail', '{}', kind => 'send')")
    rows = await db.fetch("SELECT id, kind, key FROM jobq.all_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [
        (named, None, "customer-42"),
        (positional, "send", "tenant"),
        (plain, "send", None),
    ]
    assert (await client.get(f"/jobs/{named}")).json()["key"] == "customer-42"
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("SELECT jobq.enqueue('q', '{}', key => '')")
