"""Debounce (API part 6): a burst of enqueues with one debounce key runs once, with the last payload,
`seconds` after the burst ends, and never later than `max_seconds` after its first enqueue."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import httpx
import pytest

from tests.helpers import lease, lease_one
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def debounced(client, payload, seconds=60.0, queue="q", key="user:7", **extra) -> tuple[int, dict]:
    body = {"queue": queue, "payload": payload, "debounce": {"key": key, "seconds": seconds, **extra}}
    r = await client.post("/jobs", json=body)
    assert r.status_code in (200, 201), r.text
    return r.status_code, r.json()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


async def test_a_burst_lands_in_one_job_with_the_last_payload(client, db):
    status, first = await debounced(client, 1)
    assert (status, first["debounced"], first["status"]) == (201, False, "pending")
    assert timedelta(seconds=59) < at(first["run_at"]) - at(first["created_at"]) <= timedelta(seconds=61)
    await asyncio.sleep(0.3)
    status, second = await debounced(client, 2)
    assert (status, second["debounced"], second["id"]) == (200, True, first["id"])
    assert second["payload"] == 2
    assert at(second["run_at"]) > at(first["run_at"])
    # Another key, or another queue, is another job.
    assert (await debounced(client, 3, key="user:8"))[0] == 201
    assert (await debounced(client, 4, queue="r"))[0] == 201
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 3


async def test_max_seconds_bounds_how_far_a_burst_moves_the_job(client):
    _, first = await debounced(client, 1, seconds=60, max_seconds=5)
    assert at(first["run_at"]) - at(first["created_at"]) <= timedelta(seconds=5, milliseconds=50)
    _, again = await debounced(client, 2, seconds=60, max_seconds=5)
    assert again["id"] == first["id"]
    assert at(again["run_at"]) <= at(first["created_at"]) + timedelta(seconds=5, milliseconds=1)


async def test_a_debounced_job_already_running_makes_a_new_one(client):
    _, first = await debounced(client, 1, seconds=0)
    assert (await lease_one(client, "q"))["id"] == first["id"]
    status, second = await debounced(client, 2, seconds=0)
    assert status == 201 and second["id"] != first["id"]
    assert [j["payload"] for j in await lease(client, "q")] == [2]


async def test_a_debounced_job_that_ran_goes_back_to_pending_beside_its_keys_new_job(client, db):
    """A lease ends the job's debounce: once its key has a new pending job, the one that ran can still
    fail its attempt, be released, or expire back to pending (they once met in uq_jobs_debounce: the nack
    and the release answered 500, and the expiry stopped every replica's lease expiry)."""
    jobs = []
    for n, lasting in enumerate((30, 30, 1)):
        _, job = await debounced(client, n, seconds=0)
        asked = {"queue": "q", "visibility_timeout": lasting}
        (leased,) = (await client.post("/lease", json=asked)).json()["jobs"]
        assert leased["id"] == job["id"]
        jobs.append(leased)
    status, newest = await debounced(client, "new", seconds=0)
    assert status == 201
    first, second, third = jobs
    nack = {"id": first["id"], "lease_token": first["lease_token"], "retry_after": 60}
    assert (await client.post("/nack", json=nack)).status_code == 200
    item = {"id": second["id"], "lease_token": second["lease_token"]}
    assert (await client.post("/release", json={"items": [item]})).json()["results"] == [
        {"id": second["id"], "ok": True}
    ]

    async def expired() -> bool:
        return await db.fetchval("SELECT status FROM jobq.jobs WHERE id = $1", third["id"]) == "pending"

    await until(expired)
    statuses = dict(await db.fetch("SELECT id, status FROM jobq.jobs"))
    assert statuses == {j["id"]: "pending" for j in [*jobs, newest]}
    # The key's pending job is the new one: the next enqueue of the key lands in it.
    assert (await debounced(client, "newer", seconds=0))[1]["id"] == newest["id"]


async def test_concurrent_enqueues_of_one_key_make_one_job(client, db):
    answers = await asyncio.gather(*(debounced(client, n, seconds=30) for n in range(20)))
    assert len({job["id"] for _, job in answers}) == 1
    assert sorted(status for status, _ in answers) == [200] * 19 + [201]
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 1


async def test_a_batch_may_debounce(client):
    jobs = [
        {"queue": "q", "payload": 1, "debounce": {"key": "k", "seconds": 30}},
        {"queue": "q", "payload": 2},
        {"queue": "q", "payload": 3, "debounce": {"key": "k", "seconds": 30}},
    ]
    r = await client.post("/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    made = r.json()["jobs"]
    assert [j["debounced"] for j in made] == [False, False, True]
    assert made[0]["id"] == made[2]["id"] and made[2]["payload"] == 3


@pytest.mark.parametrize("extra", [{"delay": 1}, {"dedup_key": "d"}, {"depends_on": [1]}])
async def test_debounce_goes_with_nothing_that_sets_the_job_or_its_time(client, extra):
    body = {"queue": "q", "payload": 1, "debounce": {"key": "k", "seconds": 1}, **extra}
    r = await client.post("/jobs", json=body)
    assert r.status_code == 422 and "debounce sets when the job runs" in r.text


async def test_an_idempotency_key_answers_a_debounced_repeat_as_the_first_time(client, db):
    """A retried debounced enqueue (its answer lost) is not one more enqueue of the burst: under its key it
    answers as the first time, and moves the job no further."""
    body = {"queue": "q", "payload": 1, "debounce": {"key": "user:7", "seconds": 60}}
    first = await client.post("/jobs", json=body, headers={"Idempotency-Key": "a"})
    assert first.status_code == 201, first.text
    second = await client.post("/jobs", json={**body, "payload": 2}, headers={"Idempotency-Key": "b"})
    assert (second.status_code, second.json()["debounced"]) == (200, True)
    run_at = await db.fetchval("SELECT run_at FROM jobq.jobs")
    repeat = await client.post("/jobs", json={**body, "payload": 2}, headers={"Idempotency-Key": "b"})
    assert (repeat.status_code, repeat.content) == (200, second.content)
    assert await db.fetchval("SELECT run_at FROM jobq.jobs") == run_at
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 1


async def test_a_long_poll_wakes_for_a_moved_job_when_it_falls_due(start_service):
    """A burst moves its job's run_at later; the long-poll waiting on the queue is woken when the job falls
    due at its new time, not by the safety poll (set out of reach here)."""
    service = start_service(wakeup_safety_interval=60.0)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        started = time.monotonic()
        waiting = asyncio.ensure_future(client.post("/lease", json={"queue": "q", "wait": 8}))
        await asyncio.sleep(0.3)
        _, first = await debounced(client, 1, seconds=0.6)
        await asyncio.sleep(0.3)
        _, moved = await debounced(client, 2, seconds=0.6)
        assert moved["debounced"] and at(moved["run_at"]) > at(first["run_at"])
        (job,) = (await waiting).json()["jobs"]
        assert (job["id"], job["payload"]) == (first["id"], 2)
        assert time.monotonic() - started < 4, "the long-poll ran out its wait: nothing woke it"
