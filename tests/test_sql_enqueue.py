"""Enqueue from SQL, inside the application's own transaction (jobq.enqueue)."""

import asyncpg
import pytest

pytestmark = pytest.mark.anyio


async def test_rolled_back_enqueue_never_appears(db, client):
    with pytest.raises(RuntimeError):
        async with db.transaction():
            job_id = await db.fetchval("SELECT jobq.enqueue('orders', '{\"order\": 1}'::jsonb)")
            assert job_id is not None
            raise RuntimeError("the application's own write failed")
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 0
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
    assert await db.fetchval("SELECT status FROM jobq.jobs WHERE id = $1", job_id) == "completed"


async def test_sql_enqueue_options_and_dedup(db, client):
    first = await db.fetchval(
        "SELECT jobq.enqueue('mail', 'null', run_at => now() + interval '1 hour', dedup_key => 'welcome-1')"
    )
    again = await db.fetchval("SELECT jobq.enqueue('mail', '{}', dedup_key => 'welcome-1')")
    assert again == first
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 1
    r = await client.get(f"/jobs/{first}")
    assert r.json()["payload"] is None and r.json()["status"] == "pending"
    queue = (await client.get("/queues/mail")).json()
    assert queue["scheduled"] == 1 and queue["pending"] == 0


async def test_sql_enqueue_rejects_bad_queue_names(db):
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("SELECT jobq.enqueue('no spaces', '{}')")
