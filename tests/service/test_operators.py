"""Dead jobs and queues (app/service/operators.py), called directly on a real database. What HTTP adds on top
(status codes, bodies, headers) is tested in tests/http/ under the same name."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app import service
from app.core.errors import Conflict, NotFound
from tests.helpers import db_now, row, status_of
from tests.service.calls import enqueue, lease_one, make_dead

pytestmark = pytest.mark.anyio

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
