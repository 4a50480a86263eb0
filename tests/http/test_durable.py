"""Durable steps, sleeps and events (API part 8), rule by rule, against a real service: a step recorded once
and fenced by the lease, carried on every later lease and shown on the job, within its size limit; sleeps
that count no attempt and wake their long-polls on time; events that wake every awaiting job, kept so
that one sent before the await is not lost, reaching each job once; timeouts; and what DELETE, a dead
retry and scoped tokens do to parked jobs."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.helpers import assert_problem, bearer
from tests.waiting import until

pytestmark = pytest.mark.anyio

# With the safety poll a minute away, only a wake-up answers a long-poll within these tests' bounds.
QUIET = {"wakeup_safety_interval": 60.0}


@pytest.fixture
async def http(start_service):
    async with httpx.AsyncClient(base_url=start_service(**QUIET).url, timeout=30) as client:
        yield client


async def _leased(http, queue="q", payload=None, **fields) -> dict:
    await http.post("/jobs", json={"queue": queue, "payload": payload, **fields})
    (job,) = (await http.post("/lease", json={"queue": queue})).json()["jobs"]
    return job


def _lease_of(job: dict) -> dict:
    return {"id": job["id"], "lease_token": job["lease_token"]}


async def _step(http, job, name, result, token=None):
    body = {"lease_token": token or job["lease_token"], "name": name, "result": result}
    return await http.post(f"/jobs/{job['id']}/steps", json=body)


async def _release(http, job, delay=None):
    item = _lease_of(job) | ({} if delay is None else {"delay": delay})
    r = await http.post("/release", json={"items": [item]})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


async def _await(http, job, event, timeout=3600):
    return await http.post(
        f"/jobs/{job['id']}/await",
        json={"lease_token": job["lease_token"], "event": event, "timeout": timeout},
    )


async def _metric(http, line_start: str) -> float:
    text = (await http.get("/metrics")).text
    found = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


# --- steps -----------------------------------------------------------------------------------------


async def test_a_step_is_recorded_once_and_carried_on_every_later_lease(http, db):
    job = await _leased(http, payload={"order": 7})
    r = await _step(http, job, "charge", {"charge_id": "ch_1"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": job["id"], "name": "charge", "recorded": True}
    assert (await _step(http, job, "ship", None)).status_code == 200  # null is a result too

    # The second write of a name changes nothing and answers the first result.
    again = await _step(http, job, "charge", {"charge_id": "ch_2"})
    problem = assert_problem(again, 409, "conflict")
    assert problem["result"] == {"charge_id": "ch_1"} and problem["name"] == "charge"

    shown = (await http.get(f"/jobs/{job['id']}")).json()
    assert shown["steps"] == {"charge": {"charge_id": "ch_1"}, "ship": None}

    # A crash: the lease expires, and the next lease carries the steps.
    await db.execute("UPDATE jobq.jobs SET lease_expires_at = now() WHERE id = $1", job["id"])
    (relet,) = await until(lambda: _lease_jobs(http))
    assert relet["id"] == job["id"] and relet["attempts"] == 2
    assert relet["steps"] == {"charge": {"charge_id": "ch_1"}, "ship": None}
    assert await _metric(http, 'jobq_steps_recorded_total{queue="q"}') == 2


async def _lease_jobs(http, queue="q"):
    return (await http.post("/lease", json={"queue": queue})).json()["jobs"]


async def test_a_lease_of_a_job_without_steps_or_events_carries_neither(http):
    job = await _leased(http)
    assert "steps" not in job and "events" not in job
    shown = (await http.get(f"/jobs/{job['id']}")).json()
    assert (shown["steps"], shown["events"], shown["waiting_for"], shown["sleeping_until"]) == (
        None,
        None,
        None,
        None,
    )


async def test_a_step_is_fenced_by_the_lease(http, db):
    job = await _leased(http)
    await _release(http, job)
    relet = (await _lease_jobs(http))[0]
    stale = await _step(http, job, "charge", 1)
    assert_problem(stale, 409, "lease_lost")
    assert await db.fetchval("SELECT count(*) FROM jobq.job_journal WHERE job_id = $1", job["id"]) == 0
    assert (await _step(http, relet, "charge", 1)).status_code == 200
    # A finished job records nothing either, and an unknown job is 404.
    await http.post("/ack", json=_lease_of(relet))
    assert_problem(await _step(http, relet, "later", 1), 409, "lease_lost")
    missing = {"lease_token": relet["lease_token"], "name": "x", "result": 1}
    assert_problem(await http.post("/jobs/999999/steps", json=missing), 404, "not_found")


async def test_steps_recorded_at_once_by_one_lease_are_all_kept(http, db):
    job = await _leased(http)
    answers = await asyncio.gather(*(_step(http, job, f"s{n}", n) for n in range(20)))
    assert [r.status_code for r in answers] == [200] * 20
    steps = (await http.get(f"/jobs/{job['id']}")).json()["steps"]
    assert steps == {f"s{n}": n for n in range(20)}


async def test_the_steps_of_a_job_are_held_to_their_limit(start_service, db):
    async with httpx.AsyncClient(base_url=start_service(max_steps_bytes=2048).url) as http:
        job = await _leased(http)
        assert (await _step(http, job, "big", "x" * 1500)).status_code == 200
        over = await _step(http, job, "more", "y" * 600)
        problem = assert_problem(over, 413, "payload_too_large")
        assert "JOBQ_MAX_STEPS_BYTES" in problem["detail"]
        alone = assert_problem(await _step(http, job, "huge", "z" * 3000), 413, "payload_too_large")
        assert "JOBQ_MAX_STEPS_BYTES" in alone["detail"]
        assert list((await http.get(f"/jobs/{job['id']}")).json()["steps"]) == ["big"]
        # The job still runs under its lease, and a smaller step goes in.
        assert (await _step(http, job, "small", 1)).status_code == 200


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"name": "", "result": 1}, "name"),
        ({"name": "n" * 129, "result": 1}, "name"),
        ({"result": 1}, "name"),
        ({"name": "a", "result": 1, "extra": True}, "extra"),
    ],
    ids=["empty-name", "long-name", "no-name", "unknown-field"],
)
async def test_a_bad_step_is_a_422_naming_the_field(http, body, where):
    job = await _leased(http)
    problem = assert_problem(
        await http.post(f"/jobs/{job['id']}/steps", json={"lease_token": job["lease_token"], **body}),
        422,
        "validation_error",
    )
    assert where in problem["detail"]


# --- sleeps ------------------------------------------------------------------------------------------


async def test_a_sleep_counts_no_attempt_and_wakes_its_long_poll_on_time(http, db):
    job = await _leased(http, max_attempts=1)
    await _step(http, job, "before", 1)
    assert (await _release(http, job, delay=1.0)) == {"id": job["id"], "ok": True}
    shown = (await http.get(f"/jobs/{job['id']}")).json()
    assert (shown["status"], shown["attempts"]) == ("pending", 0)
    assert shown["sleeping_until"] is not None
    assert await _lease_jobs(http) == []  # nothing is due while it sleeps

    started = time.monotonic()
    r = await http.post("/lease", json={"queue": "q", "wait": 10})
    slept = time.monotonic() - started
    (woke,) = r.json()["jobs"]
    assert woke["id"] == job["id"] and woke["attempts"] == 1  # its one attempt is still there
    assert woke["steps"] == {"before": 1}
    assert 0.5 <= slept < 1.5  # woken when due, not by the safety poll (a minute away)
    assert (await http.get(f"/jobs/{job['id']}")).json()["sleeping_until"] is None
    assert await _metric(http, 'jobq_sleeps_total{queue="q"}') == 1


async def test_a_release_delay_is_bounded_to_a_year(http):
    job = await _leased(http)
    item = _lease_of(job) | {"delay": 31_536_001}
    assert_problem(await http.post("/release", json={"items": [item]}), 422, "validation_error")
    assert_problem(
        await http.post("/release", json={"items": [_lease_of(job) | {"delay": -1}]}), 422, "validation_error"
    )


# --- events ------------------------------------------------------------------------------------------


async def test_an_event_wakes_every_job_awaiting_it(http, db):
    parked = []
    for queue in ("a", "b", "b"):
        job = await _leased(http, queue=queue)
        r = await _await(http, job, "paid:7")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "waiting" and r.json()["event_id"] is None
        parked.append(job)
    other = await _leased(http, queue="a")
    await _await(http, other, "paid:8")

    shown = (await http.get(f"/jobs/{parked[0]['id']}")).json()
    assert shown["status"] == "waiting" and shown["attempts"] == 0
    assert shown["waiting_for"]["event"] == "paid:7"
    listed = (await http.get("/jobs", params={"status": "waiting"})).json()["jobs"]
    assert sorted(j["id"] for j in listed) == sorted(j["id"] for j in [*parked, other])
    assert await _lease_jobs(http, "a") == []  # a waiting job is never leased

    sent = await http.post("/events", json={"name": "paid:7", "payload": {"amount": 42}})
    assert sent.status_code == 200, sent.text
    assert sent.json()["woken"] == 3
    for job in parked:
        (woke,) = await _lease_jobs(http, job["queue"])
        assert woke["id"] == job["id"] and woke["attempts"] == 1
        (reached,) = woke["events"]
        assert (reached["name"], reached["payload"], reached["id"]) == (
            "paid:7",
            {"amount": 42},
            sent.json()["id"],
        )
    assert (await http.get(f"/jobs/{other['id']}")).json()["status"] == "waiting"
    assert await _metric(http, 'jobq_event_wakes_total{queue="b"}') == 2
    assert await _metric(http, "jobq_events_sent_total") == 1


async def test_an_event_wakes_a_waiting_long_poll(http):
    job = await _leased(http)
    await _await(http, job, "go")
    lease = asyncio.create_task(http.post("/lease", json={"queue": "q", "wait": 10}))
    await asyncio.sleep(0.3)
    assert not lease.done()
    sent = time.monotonic()
    await http.post("/events", json={"name": "go"})
    (woke,) = (await lease).json()["jobs"]
    assert woke["id"] == job["id"] and time.monotonic() - sent < 0.5


async def test_an_event_sent_before_the_await_is_not_lost(http, db):
    await http.post("/events", json={"name": "early", "payload": "before the job"})
    job = await _leased(http)
    # Sent before the job was enqueued: not this job's.
    assert (await _await(http, job, "early")).json()["status"] == "waiting"
    job2 = await _leased(http, queue="q2")
    sent = (await http.post("/events", json={"name": "paid", "payload": 1})).json()
    assert sent["woken"] == 0
    # Sent after the job was enqueued, before it awaited: the await does not park it.
    r = await _await(http, job2, "paid")
    assert r.json()["status"] == "pending" and r.json()["event_id"] == sent["id"]
    (again,) = await _lease_jobs(http, "q2")
    assert [e["payload"] for e in again["events"]] == [1]
    assert again["attempts"] == 1
    # Each event reaches a job once: awaiting the name again parks it until the next one.
    assert (await _await(http, again, "paid")).json()["status"] == "waiting"
    second = (await http.post("/events", json={"name": "paid", "payload": 2})).json()
    assert second["woken"] == 1
    (third,) = await _lease_jobs(http, "q2")
    assert [e["payload"] for e in third["events"]] == [1, 2]


async def test_events_sent_before_two_awaits_reach_them_in_order(http):
    job = await _leased(http)
    for n in (1, 2):
        await http.post("/events", json={"name": "tick", "payload": n})
    for n in (1, 2):
        assert (await _await(http, job, "tick")).json()["status"] == "pending"
        (job,) = await _lease_jobs(http)
        assert [e["payload"] for e in job["events"]] == list(range(1, n + 1))


async def test_a_wait_that_runs_out_makes_the_job_pending_without_the_event(http, db):
    job = await _leased(http)
    r = await _await(http, job, "never", timeout=1)
    assert r.json()["status"] == "waiting"
    started = time.monotonic()
    lease = await http.post("/lease", json={"queue": "q", "wait": 10})
    (woke,) = lease.json()["jobs"]
    assert 0.7 <= time.monotonic() - started < 2.5  # within the expiry interval of its deadline
    (entry,) = woke["events"]
    assert entry["name"] == "never" and entry["timed_out"] is True and entry["payload"] is None
    assert woke["attempts"] == 1
    assert (await http.post("/events", json={"name": "never"})).json()["woken"] == 0
    assert await _metric(http, 'jobq_event_waits_expired_total{queue="q"}') == 1


async def test_an_await_is_fenced_by_the_lease(http, db):
    job = await _leased(http)
    await _release(http, job)
    relet = (await _lease_jobs(http))[0]
    assert_problem(await _await(http, job, "e"), 409, "lease_lost")
    assert await db.fetchval("SELECT status FROM jobq.jobs WHERE id = $1", job["id"]) == "running"
    body = {"lease_token": relet["lease_token"], "event": "e", "timeout": 5}
    assert_problem(await http.post("/jobs/999999/await", json=body), 404, "not_found")
    for bad in ({"timeout": 0}, {"timeout": 31_536_001}, {"event": ""}, {"event": "e" * 257}):
        assert_problem(
            await http.post(f"/jobs/{relet['id']}/await", json=body | bad), 422, "validation_error"
        )


async def test_delete_cancels_a_sleeping_or_waiting_job_and_a_dead_retry_leaves_them(http, db):
    sleeper = await _leased(http)
    await _release(http, sleeper, delay=3600)
    waiter = await _leased(http)
    await _await(http, waiter, "paid:9")
    retried = await http.post("/dead/retry", json={"ids": [sleeper["id"], waiter["id"]]})
    assert retried.json()["retried"] == 0
    for job in (sleeper, waiter):
        r = await http.delete(f"/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert (await http.post("/events", json={"name": "paid:9"})).json()["woken"] == 0
    assert (await http.get(f"/jobs/{waiter['id']}")).json()["status"] == "cancelled"


async def test_a_dead_job_retried_keeps_its_steps_and_resumes_after_them(http):
    job = await _leased(http)
    await _step(http, job, "charge", {"charge_id": "ch_1"})
    await http.post("/nack", json=_lease_of(job) | {"dead": True, "error": "shipping API down"})
    assert (await http.post("/dead/retry", json={"ids": [job["id"]]})).json()["retried"] == 1
    (again,) = await _lease_jobs(http)
    assert again["steps"] == {"charge": {"charge_id": "ch_1"}} and again["attempts"] == 1


async def test_an_event_from_sql_wakes_at_commit(http, db):
    job = await _leased(http)
    await _await(http, job, "from-sql")
    async with db.transaction():
        row = await db.fetchrow("SELECT * FROM jobq.send_event('from-sql', '{\"ok\": true}')")
        assert row["woken"] == 1
        assert (await http.get(f"/jobs/{job['id']}")).json()["status"] == "waiting"  # not yet committed
    (woke,) = await _lease_jobs(http)
    assert woke["events"][0]["payload"] == {"ok": True}


async def test_events_are_listed_newest_first_and_pruned_after_their_retention(start_service, db):
    service = start_service(event_retention=1, prune_interval=0.2)
    async with httpx.AsyncClient(base_url=service.url) as http:
        for n in range(3):
            await http.post("/events", json={"name": f"e{n % 2}", "payload": n})
        page = (await http.get("/events", params={"limit": 2})).json()
        assert [e["payload"] for e in page["events"]] == [2, 1]
        rest = (await http.get("/events", params={"before_id": page["next_before_id"]})).json()
        assert [e["payload"] for e in rest["events"]] == [0] and rest["next_before_id"] is None
        named = (await http.get("/events", params={"name": "e0"})).json()["events"]
        assert [e["payload"] for e in named] == [2, 0]
        await until(lambda: _no_events(db), timeout=10)


async def test_a_name_with_u0000_is_refused_as_the_schema_says(http, db):
    """PostgreSQL's text and jsonb cannot hold U+0000: a step, event or filter name with one is refused
    by its schema, with the field named, before it reaches the database."""
    job = await _leased(http)
    for method, path, kwargs in (
        ("GET", "/events", {"params": {"name": "a\x00b"}}),
        ("POST", "/events", {"json": {"name": "a\x00b"}}),
        ("POST", f"/jobs/{job['id']}/steps", {"json": {"lease_token": job["lease_token"], "name": "a\x00"}}),
    ):
        refused = await http.request(method, path, **kwargs)
        assert refused.status_code == 422, (path, refused.text)
        assert refused.json()["code"] == "validation_error" and "name" in refused.text, refused.text
    assert await db.fetchval("SELECT count(*) FROM jobq.events") == 0
    assert (await http.get(f"/jobs/{job['id']}")).json()["steps"] in (None, {})


async def _no_events(db):
    return await db.fetchval("SELECT count(*) FROM jobq.events") == 0


async def test_an_event_from_a_token_limited_to_some_queues_reaches_only_them(start_service):
    tokens = {"t-admin": "admin", "t-a": {"roles": ["producer", "worker", "viewer"], "queues": ["a.*"]}}
    service = start_service(tokens=tokens, **QUIET)
    admin, limited = bearer("t-admin"), bearer("t-a")
    async with httpx.AsyncClient(base_url=service.url, headers=admin) as http:
        inside = await _leased(http, queue="a.1")
        outside = await _leased(http, queue="b.1")
        for job in (inside, outside):
            await _await(http, job, "shared")
        sent = await http.post("/events", json={"name": "shared"}, headers=limited)
        assert sent.json()["woken"] == 1
        assert (await http.get(f"/jobs/{inside['id']}")).json()["status"] == "pending"
        assert (await http.get(f"/jobs/{outside['id']}")).json()["status"] == "waiting"
        # Kept with its scope: a later await outside it does not find it either.
        late = await _leased(http, queue="b.2")
        assert (await _await(http, late, "shared")).json()["status"] == "waiting"
        # The limited token sees only its own events; the admin sees all.
        assert len((await http.get("/events", headers=limited)).json()["events"]) == 1
        await http.post("/events", json={"name": "everyone"})
        assert len((await http.get("/events", headers=limited)).json()["events"]) == 1
        assert len((await http.get("/events")).json()["events"]) == 2


async def test_run_now_wakes_a_sleeping_job_and_refuses_a_waiting_one(http):
    sleeper = await _leased(http)
    await _release(http, sleeper, delay=3600)
    r = await http.post(f"/jobs/{sleeper['id']}/run")
    assert r.status_code == 200, r.text
    (woke,) = await _lease_jobs(http)
    assert woke["id"] == sleeper["id"] and woke["attempts"] == 1
    waiter = await _leased(http, queue="w")
    await _await(http, waiter, "later")
    assert_problem(await http.post(f"/jobs/{waiter['id']}/run"), 409, "conflict")


async def test_the_steps_and_events_of_a_job_gone_are_pruned(start_service, db):
    async with httpx.AsyncClient(base_url=start_service(prune_interval=0.2).url) as http:
        job = await _leased(http)
        await _step(http, job, "charge", 1)
        await http.post("/nack", json=_lease_of(job) | {"dead": True})
        kept = await _leased(http, queue="kept")
        await _step(http, kept, "charge", 2)
        assert await db.fetchval("SELECT count(*) FROM jobq.job_journal") == 2
        assert (await http.delete(f"/dead/{job['id']}")).status_code == 200

        async def pruned() -> bool:
            return await db.fetchval("SELECT array_agg(job_id) FROM jobq.job_journal") == [kept["id"]]

        await until(pruned)
