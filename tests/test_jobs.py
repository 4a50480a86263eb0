"""The service layer (app/service/) called directly, without HTTP or a running service: each operation on a
real database, its effect checked in jobq.jobs and jobq.queues. What HTTP adds on top (status codes,
bodies, headers) is tested in test_producers.py, test_workers.py and test_operators.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from helpers import count, db_now, open_runtime, row, status_of

from app import service
from app.core.errors import Conflict, LeaseLost, NotFound, PayloadTooLarge
from app.core.limits import DEFAULT_MAX_ATTEMPTS
from app.core.tokens import token_text
from app.service.runtime import Runtime

pytestmark = pytest.mark.anyio

MISSING_ID = 987_654_321


@pytest.fixture
async def runtime(database_url: str) -> AsyncIterator[Runtime]:
    async with open_runtime(database_url) as runtime:
        yield runtime


# --- the calls, as the routers make them ------------------------------------------------------------


async def enqueue(runtime: Runtime, queue: str = "q", payload: Any = None, **fields: Any) -> service.Row:
    return await service.enqueue(runtime, service.NewJob(queue, payload, **fields))


async def lease(
    runtime: Runtime, queue: str = "q", max_jobs: int = 1, visibility_timeout: float | None = None
) -> list[service.Row]:
    """A lease that does not wait (`wait` 0). The runtime's Wakeups are never started: a lease that does
    not wait only asks them whether the service is closing."""
    return await service.lease(
        runtime,
        queue=queue,
        max_jobs=max_jobs,
        visibility_timeout=visibility_timeout,
        wait=0,
        worker_id="w1",
    )


async def lease_one(
    runtime: Runtime, queue: str = "q", visibility_timeout: float | None = None
) -> service.Row:
    (leased,) = await lease(runtime, queue, visibility_timeout=visibility_timeout)
    return leased


def held(job: service.Row) -> service.JobLease:
    return service.JobLease(job["id"], job["lease_token"])


async def ack(runtime: Runtime, item: service.JobLease) -> service.Row:
    return service.single(await service.ack(runtime, item))


async def nack(runtime: Runtime, job: service.Row, **fields: Any) -> service.Row:
    """Nack the lease `job` was leased under (a job as leased, or any {id, lease_token})."""
    return service.single(await service.nack(runtime, service.Nack(job["id"], job["lease_token"], **fields)))


async def make_dead(runtime: Runtime, queue: str = "q", **fields: Any) -> int:
    """A dead job (enqueued with max_attempts=1, leased, nacked); its id. The queue must have no other
    ready job."""
    job = await enqueue(runtime, queue, max_attempts=1, **fields)
    leased = await lease_one(runtime, queue)
    assert leased["id"] == job["id"]
    assert (await nack(runtime, leased, error="boom"))["status"] == "dead"
    return job["id"]


async def expire(db: asyncpg.Connection, job_id: int) -> None:
    """The lease's deadline passes (moved into the past, not waited for)."""
    await db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = $1", job_id)


# --- enqueue --------------------------------------------------------------------------------------


async def test_enqueue_inserts_a_pending_job_and_its_queue(runtime, db):
    job = await enqueue(runtime, "emails", {"to": "ada"}, priority=2)
    assert (job["queue"], job["status"], job["priority"], job["attempts"]) == ("emails", "pending", 2, 0)
    assert job["max_attempts"] == DEFAULT_MAX_ATTEMPTS and job["duplicate"] is False
    stored = await row(db, job["id"])
    assert (stored["status"], stored["payload"], stored["attempts"]) == ("pending", '{"to": "ada"}', 0)
    assert await count(db, table="queues") == 1


async def test_enqueue_batch_inserts_every_job_in_order(runtime, db):
    batch = [service.NewJob("q", i) for i in range(3)] + [service.NewJob("other", 3, delay=3600)]
    created = await service.enqueue_batch(runtime, batch)
    assert [j["queue"] for j in created] == ["q", "q", "q", "other"]
    assert [j["id"] for j in created] == sorted(j["id"] for j in created)
    assert await count(db, "status = 'pending'") == 4
    assert await count(db, "run_at > now()") == 1


async def test_a_batch_with_a_payload_too_large_inserts_nothing(runtime, db):
    too_large = "x" * (runtime.settings.max_payload_bytes + 1)
    with pytest.raises(PayloadTooLarge):
        await service.enqueue_batch(runtime, [service.NewJob("q", 1), service.NewJob("q", too_large)])
    assert await count(db) == 0


async def test_a_held_dedup_key_answers_with_its_holder(runtime, db):
    first = await enqueue(runtime, "q", 1, dedup_key="k")
    again = await enqueue(runtime, "q", 2, dedup_key="k")
    assert (again["id"], again["duplicate"]) == (first["id"], True)
    assert await count(db) == 1 and (await row(db, first["id"]))["payload"] == "1"
    other = await enqueue(runtime, "other", 3, dedup_key="k")  # each queue has its own keys
    assert other["id"] != first["id"] and other["duplicate"] is False
    batch = await service.enqueue_batch(runtime, [service.NewJob("q", 4, dedup_key="k")] * 2)
    assert [(j["id"], j["duplicate"]) for j in batch] == [(first["id"], True)] * 2
    assert await count(db) == 2


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


# --- cancel ---------------------------------------------------------------------------------------


async def test_cancel_a_pending_job(runtime, db):
    job = await enqueue(runtime, delay=3600)
    assert (await service.cancel(runtime.db, job["id"]))["status"] == "cancelled"
    stored = await row(db, job["id"])
    assert stored["status"] == "cancelled" and stored["completed_at"] is not None


@pytest.mark.parametrize("status", ["running", "completed", "dead", "cancelled"])
async def test_cancel_is_a_conflict_unless_the_job_is_pending(runtime, db, status):
    job = await enqueue(runtime, max_attempts=1)
    if status == "cancelled":
        await service.cancel(runtime.db, job["id"])
    else:
        leased = await lease_one(runtime)
        if status == "completed":
            await ack(runtime, held(leased))
        elif status == "dead":
            await nack(runtime, leased)
    before = dict(await row(db, job["id"]))
    assert before["status"] == status
    with pytest.raises(Conflict) as refused:
        await service.cancel(runtime.db, job["id"])
    assert refused.value.extra == {"job_status": status}
    assert dict(await row(db, job["id"])) == before
    with pytest.raises(NotFound):
        await service.cancel(runtime.db, MISSING_ID)


# --- dead jobs ------------------------------------------------------------------------------------


async def test_dead_jobs_newest_first_a_page_at_a_time(runtime, db):
    dead = [await make_dead(runtime, "a") for _ in range(3)]
    elsewhere = await make_dead(runtime, "b")
    await enqueue(runtime, "a")  # a pending job is not listed
    page = await service.dead_jobs(runtime.db, "a", 2, None)
    assert [j["id"] for j in page["jobs"]] == [dead[2], dead[1]] and page["next_before_id"] == dead[1]
    page = await service.dead_jobs(runtime.db, "a", 2, page["next_before_id"])
    assert [j["id"] for j in page["jobs"]] == [dead[0]] and page["next_before_id"] is None
    every = await service.dead_jobs(runtime.db, None, 10, None)
    assert [j["id"] for j in every["jobs"]] == [elsewhere, *dead[::-1]]


async def test_retry_dead_skips_a_job_whose_dedup_key_is_held(runtime, db):
    plain = await make_dead(runtime)
    keyed = await make_dead(runtime, dedup_key="k")
    holder = await enqueue(runtime, dedup_key="k", delay=3600)
    other_queue = await make_dead(runtime, "other")
    assert await service.retry_dead(runtime.db, None, "q") == {"retried": 1, "skipped": [keyed]}
    stored = await row(db, plain)
    assert (stored["status"], stored["attempts"], stored["lease_token"]) == ("pending", 0, None)
    assert [await status_of(db, i) for i in (keyed, holder["id"], other_queue)] == ["dead", "pending", "dead"]
    assert await service.retry_dead(runtime.db, [other_queue], None) == {"retried": 1, "skipped": []}
    assert await status_of(db, other_queue) == "pending"


async def test_purge_dead_deletes_a_dead_job_only(runtime, db):
    dead = await make_dead(runtime)
    pending = await enqueue(runtime)
    assert await service.purge_dead(runtime.db, dead) == {"id": dead, "purged": True}
    assert await status_of(db, dead) is None
    with pytest.raises(Conflict):
        await service.purge_dead(runtime.db, pending["id"])
    with pytest.raises(NotFound):
        await service.purge_dead(runtime.db, dead)
    assert await status_of(db, pending["id"]) == "pending"


# --- queues ---------------------------------------------------------------------------------------


async def test_configure_queue_creates_it_and_changes_only_what_is_given(runtime, db):
    created = await service.configure_queue(runtime, "cfg", service.QueueSettings(max_attempts=2))
    assert created["queue"] == "cfg" and created["paused"] is False
    assert created["settings"] == {
        "visibility_timeout": 30,
        "max_attempts": 2,
        "backoff_base": 30,
        "backoff_cap": 3600,
        "retention": 86400,
        "key_concurrency": None,
        "fair": False,
        "rate": None,
        "key_rate": None,
    }
    changed = await service.configure_queue(runtime, "cfg", service.QueueSettings(visibility_timeout=5))
    assert (changed["settings"]["visibility_timeout"], changed["settings"]["max_attempts"]) == (5, 2)
    stored = await db.fetchrow("SELECT visibility_timeout, max_attempts FROM jobq.queues WHERE name = 'cfg'")
    assert tuple(stored) == (5, 2)
    job = await enqueue(runtime, "cfg")
    assert job["max_attempts"] == 2  # the queue's setting, for jobs that do not set their own
    t0 = await db_now(db)
    await lease_one(runtime, "cfg")  # the queue's visibility timeout
    assert (await row(db, job["id"]))["lease_expires_at"] <= t0 + timedelta(seconds=6)


# --- background -----------------------------------------------------------------------------------


async def test_expire_leases_returns_expired_jobs_to_pending_or_dead(runtime, db):
    retried = await enqueue(runtime, payload=1)
    last = await enqueue(runtime, payload=2, max_attempts=1)
    kept = await enqueue(runtime, payload=3)
    first, _, _ = await lease(runtime, max_jobs=3)
    assert first["id"] == retried["id"]
    await expire(db, retried["id"])
    await expire(db, last["id"])
    changed = await service.expire_leases(runtime)
    assert sorted((r["id"], r["status"]) for r in changed) == [
        (retried["id"], "pending"),
        (last["id"], "dead"),
    ]
    assert await status_of(db, kept["id"]) == "running"
    assert (await row(db, retried["id"]))["last_error"].startswith("lease expired at ")
    # The late holder may still ack: its work was done.
    await ack(runtime, held(first))
    assert await status_of(db, retried["id"]) == "completed"
    assert await service.expire_leases(runtime) == []
