"""Lease, ack, nack, extend and release (app/service/leasing.py, app/service/workers.py), called directly on a
real database. What HTTP adds on top (status codes, bodies, headers) is tested in tests/http/ under the
same name."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app import service
from app.core.errors import LeaseLost, NotFound
from app.core.tokens import token_text
from tests.helpers import count, db_now, row, status_of
from tests.service.calls import ack, enqueue, expire, held, lease, lease_one, nack

pytestmark = pytest.mark.anyio

MISSING_ID = 987_654_321


# --- lease ----------------------------------------------------------------------------------------


async def test_lease_claims_by_priority_then_run_at(runtime, db):
    now = datetime.now(UTC)
    late = await enqueue(runtime, payload="late", run_at=now - timedelta(seconds=10))
    urgent = await enqueue(runtime, payload="urgent", priority=-1)
    early = await enqueue(runtime, payload="early", run_at=now - timedelta(seconds=60))
    future = await enqueue(runtime, payload="future", delay=3600)
    t0 = await db_now(db)
    leased = await lease(runtime, max_jobs=10, visibility_timeout=120)
    t1 = await db_now(db)
    assert [j["id"] for j in leased] == [urgent["id"], early["id"], late["id"]]
    for job in leased:
        stored = await row(db, job["id"])
        assert (stored["status"], stored["attempts"], stored["worker_id"]) == ("running", 1, "w1")
        assert token_text(stored["lease_token"], stored["queue"]) == job["lease_token"]
        assert t0 + timedelta(seconds=120) <= stored["lease_expires_at"] <= t1 + timedelta(seconds=120)
    assert await status_of(db, future["id"]) == "pending"


async def test_each_lease_is_fenced_with_a_fresh_token(runtime, db):
    job = await enqueue(runtime)
    first = await lease_one(runtime)
    await expire(db, job["id"])
    assert [(r["id"], r["status"]) for r in await service.expire_leases(runtime)] == [(job["id"], "pending")]
    second = await lease_one(runtime)
    assert second["id"] == job["id"] and second["lease_token"] != first["lease_token"]
    assert second["attempts"] == 2
    with pytest.raises(LeaseLost):
        await ack(runtime, held(first))
    assert await status_of(db, job["id"]) == "running"
    await ack(runtime, held(second))
    assert await status_of(db, job["id"]) == "completed"


async def test_a_paused_queue_leases_nothing(runtime, db):
    job = await enqueue(runtime)
    assert (await service.set_paused(runtime.db, "q", True))["paused"] is True
    assert await lease(runtime, max_jobs=10) == []
    assert await status_of(db, job["id"]) == "pending"
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'q'") is True
    assert (await service.set_paused(runtime.db, "q", False))["paused"] is False
    assert (await lease_one(runtime))["id"] == job["id"]


async def test_an_unknown_queue_leases_nothing(runtime, db):
    assert await lease(runtime, "nobody") == []
    assert await count(db, table="queues") == 0


# --- ack ------------------------------------------------------------------------------------------


async def test_ack_completes_the_job(runtime, db):
    job = await enqueue(runtime)
    leased = await lease_one(runtime)
    assert await ack(runtime, held(leased)) == {"id": job["id"], "ok": True}
    stored = await row(db, job["id"])
    assert (stored["status"], stored["lease_expires_at"]) == ("completed", None)
    assert stored["completed_at"] is not None


async def test_an_ack_under_another_token_is_lease_lost(runtime, db):
    job = await enqueue(runtime)
    await lease_one(runtime)
    for token in (str(uuid.uuid4()), "not a token"):
        with pytest.raises(LeaseLost):
            await ack(runtime, service.JobLease(job["id"], token))
    assert await status_of(db, job["id"]) == "running"
    with pytest.raises(NotFound):
        await ack(runtime, service.JobLease(MISSING_ID, str(uuid.uuid4())))


async def test_a_repeated_ack_of_the_same_lease_is_ok(runtime, db):
    job = await enqueue(runtime)
    leased = await lease_one(runtime)
    await ack(runtime, held(leased))
    completed_at = (await row(db, job["id"]))["completed_at"]
    assert await ack(runtime, held(leased)) == {"id": job["id"], "ok": True}
    assert (await service.ack_batch(runtime, [held(leased)] * 2)) == [{"id": job["id"], "ok": True}] * 2
    assert (await row(db, job["id"]))["completed_at"] == completed_at


# --- nack -----------------------------------------------------------------------------------------


async def test_nack_retries_after_the_queue_backoff(runtime, db):
    await service.configure_queue(runtime, "q", service.QueueSettings(backoff_base=10, backoff_cap=100))
    job = await enqueue(runtime)
    leased = await lease_one(runtime)
    t0 = await db_now(db)
    answer = await nack(runtime, leased, error="try later")
    t1 = await db_now(db)
    assert answer["status"] == "pending"
    stored = await row(db, job["id"])
    assert (stored["status"], stored["attempts"], stored["last_error"]) == ("pending", 1, "try later")
    assert stored["lease_token"] is None
    # Attempt 1 waits the base, plus up to 30 % jitter.
    assert t0 + timedelta(seconds=10) <= stored["run_at"] <= t1 + timedelta(seconds=13)
    assert await lease(runtime) == []


async def test_nack_retries_after_the_given_delay(runtime, db):
    job = await enqueue(runtime)
    t0 = await db_now(db)
    await nack(runtime, await lease_one(runtime), retry_after=60)
    t1 = await db_now(db)
    stored = await row(db, job["id"])
    assert stored["status"] == "pending"
    assert t0 + timedelta(seconds=60) <= stored["run_at"] <= t1 + timedelta(seconds=60)


async def test_nack_on_the_last_attempt_is_dead(runtime, db):
    job = await enqueue(runtime, max_attempts=1)
    answer = await nack(runtime, await lease_one(runtime), error="boom")
    assert answer["status"] == "dead"
    stored = await row(db, job["id"])
    assert (stored["status"], stored["attempts"], stored["last_error"]) == ("dead", 1, "boom")
    assert stored["run_at"] == job["run_at"]  # a dead job keeps its run_at


async def test_nack_dead_is_dead_whatever_attempts_are_left(runtime, db):
    job = await enqueue(runtime, max_attempts=5)
    assert (await nack(runtime, await lease_one(runtime), dead=True))["status"] == "dead"
    assert (await status_of(db, job["id"]), (await row(db, job["id"]))["attempts"]) == ("dead", 1)
    with pytest.raises(LeaseLost):  # the lease is over
        await nack(runtime, {"id": job["id"], "lease_token": str(uuid.uuid4())})


# --- extend and release ---------------------------------------------------------------------------


async def test_extend_moves_the_deadline_of_the_current_lease_only(runtime, db):
    job = await enqueue(runtime)
    leased = await lease_one(runtime, visibility_timeout=30)
    t0 = await db_now(db)
    extended = await service.extend(runtime.db, job["id"], leased["lease_token"], 600)
    t1 = await db_now(db)
    stored = await row(db, job["id"])
    assert extended == {"id": job["id"], "lease_expires_at": stored["lease_expires_at"]}
    assert t0 + timedelta(seconds=600) <= stored["lease_expires_at"] <= t1 + timedelta(seconds=600)
    with pytest.raises(LeaseLost):
        await service.extend(runtime.db, job["id"], str(uuid.uuid4()), 600)
    await ack(runtime, held(leased))
    with pytest.raises(LeaseLost):  # completed: no lease left to extend
        await service.extend(runtime.db, job["id"], leased["lease_token"], 600)
    with pytest.raises(NotFound):
        await service.extend(runtime.db, MISSING_ID, leased["lease_token"], 600)


async def test_release_gives_the_job_back_without_counting_the_attempt(runtime, db):
    job = await enqueue(runtime)
    leased = await lease_one(runtime)
    assert await service.release(runtime.db, [held(leased)]) == [{"id": job["id"], "ok": True}]
    stored = await row(db, job["id"])
    assert (stored["status"], stored["attempts"], stored["lease_token"]) == ("pending", 0, None)
    again = await service.release(runtime.db, [held(leased)])  # that lease is over
    assert again == [{"id": job["id"], "ok": False, "code": "lease_lost"}]
    assert (await lease_one(runtime))["attempts"] == 1
