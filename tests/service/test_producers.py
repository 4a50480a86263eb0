"""Enqueue and cancel (app/service/producers.py), called directly on a real database. What HTTP adds on top
(status codes, bodies, headers) is tested in tests/http/ under the same name."""

from __future__ import annotations

import pytest

from app import service
from app.core.errors import Conflict, NotFound, PayloadTooLarge
from app.core.limits import DEFAULT_MAX_ATTEMPTS
from tests.helpers import count, row
from tests.service.calls import ack, enqueue, held, lease_one, nack

pytestmark = pytest.mark.anyio

MISSING_ID = 987_654_321


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
