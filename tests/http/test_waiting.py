"""Waiting for a job: `GET /jobs/{id}?wait=N` answers when the job finishes, on whichever replica it
finished, woken by a notification and never by polling."""

import asyncio
import time

import httpx
import pytest

from tests.helpers import assert_problem
from tests.waiting import until

pytestmark = pytest.mark.anyio

# With the safety poll a minute away, only a notification can answer a waiter within these bounds.
QUIET = {"wakeup_safety_interval": 60.0}


@pytest.fixture
def replicas(start_service):
    """Two service processes on one database: a waiter on the first, everything else on the second."""
    return start_service(**QUIET), start_service(**QUIET)


@pytest.fixture
async def a(replicas):
    unlimited = httpx.Limits(max_connections=None)  # one connection per waiter
    async with httpx.AsyncClient(base_url=replicas[0].url, timeout=90, limits=unlimited) as http:
        yield http


@pytest.fixture
async def b(replicas):
    async with httpx.AsyncClient(base_url=replicas[1].url, timeout=30) as http:
        yield http


async def enqueue_and_lease(http, queue="q", **job):
    created = (await http.post("/jobs", json={"queue": queue, "payload": 1, **job})).json()
    (leased,) = (await http.post("/lease", json={"queue": queue})).json()["jobs"]
    assert leased["id"] == created["id"]
    return leased


async def answered_after(a, job_id, finish, wait=10):
    """Wait for the job on `a`, run `finish` once the waiter is waiting; the answer, and seconds from the
    end of `finish` (its commit) to the answer."""
    waiter = asyncio.create_task(a.get(f"/jobs/{job_id}", params={"wait": wait}))
    await asyncio.sleep(0.3)
    assert not waiter.done(), "the wait answered before the job finished"
    await finish()
    finished = time.monotonic()
    r = await waiter
    assert r.status_code == 200, r.text
    return r.json(), time.monotonic() - finished


async def test_an_ack_on_another_replica_answers_the_waiter_with_the_result(a, b):
    job = await enqueue_and_lease(b)
    ack = {"id": job["id"], "lease_token": job["lease_token"], "result": {"total": 42}}
    answer, latency = await answered_after(a, job["id"], lambda: b.post("/ack", json=ack))
    assert answer["status"] == "completed" and answer["result"] == {"total": 42}
    assert latency < 0.2


async def test_a_batch_ack_answers_every_waiter_of_its_jobs(a, b):
    jobs = [await enqueue_and_lease(b) for _ in range(5)]
    waiters = [asyncio.create_task(a.get(f"/jobs/{j['id']}", params={"wait": 10})) for j in jobs]
    second = asyncio.create_task(a.get(f"/jobs/{jobs[0]['id']}", params={"wait": 10}))  # two on one job
    await asyncio.sleep(0.3)
    items = [{"id": j["id"], "lease_token": j["lease_token"], "result": j["id"]} for j in jobs]
    await b.post("/ack/batch", json={"items": items})
    done = await asyncio.wait_for(asyncio.gather(*waiters, second), 2)
    assert [r.json()["result"] for r in done] == [j["id"] for j in jobs] + [jobs[0]["id"]]


async def test_dead_and_cancelled_answer_the_waiter_and_a_retry_does_not(a, b):
    job = await enqueue_and_lease(b, max_attempts=2)
    waiter = asyncio.create_task(a.get(f"/jobs/{job['id']}", params={"wait": 10}))
    await asyncio.sleep(0.3)
    # A retry is not an end: the waiter keeps waiting through it.
    await b.post("/nack", json={"id": job["id"], "lease_token": job["lease_token"], "retry_after": 0})
    await asyncio.sleep(0.3)
    assert not waiter.done()
    (again,) = (await b.post("/lease", json={"queue": "q"})).json()["jobs"]
    await b.post("/nack", json={"id": again["id"], "lease_token": again["lease_token"], "error": "boom"})
    answer = (await asyncio.wait_for(waiter, 2)).json()
    assert answer["status"] == "dead" and answer["last_error"] == "boom"

    pending = (await b.post("/jobs", json={"queue": "q", "payload": 2, "delay": 3600})).json()
    answer, latency = await answered_after(a, pending["id"], lambda: b.delete(f"/jobs/{pending['id']}"))
    assert answer["status"] == "cancelled" and latency < 0.2


async def test_a_lease_expiring_into_dead_answers_the_waiter(replicas, a, b):
    job = await enqueue_and_lease(b, max_attempts=1)
    await b.post(
        "/extend", json={"id": job["id"], "lease_token": job["lease_token"], "visibility_timeout": 1}
    )
    started = time.monotonic()
    answer = (await a.get(f"/jobs/{job['id']}", params={"wait": 10})).json()
    assert answer["status"] == "dead" and "lease expired" in answer["last_error"]
    assert time.monotonic() - started < 3


async def test_a_finished_or_unknown_job_is_answered_at_once(a, b):
    job = await enqueue_and_lease(b)
    await b.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
    started = time.monotonic()
    assert (await a.get(f"/jobs/{job['id']}", params={"wait": 30})).json()["status"] == "completed"
    assert_problem(await a.get("/jobs/999999", params={"wait": 30}), 404, "not_found")
    assert time.monotonic() - started < 1


async def test_the_wait_runs_out_and_answers_the_job_as_it_is(a, b):
    job = (await b.post("/jobs", json={"queue": "q", "payload": 1})).json()
    started = time.monotonic()
    answer = (await a.get(f"/jobs/{job['id']}", params={"wait": 0.5})).json()
    assert answer["status"] == "pending"
    assert 0.5 <= time.monotonic() - started < 1.5


async def test_wait_is_checked(a):
    for wait in ("61", "-1", "soon"):
        problem = assert_problem(await a.get("/jobs/1", params={"wait": wait}), 422, "validation_error")
        assert "wait" in problem["detail"]


@pytest.mark.slow
async def test_waiters_hold_no_connection_and_send_no_statement_while_waiting(replicas, a, b, db):
    """200 waiters on one replica: they mark their jobs once each, then cost the database nothing until
    their jobs finish, and the pool stays within its size."""
    service = replicas[0]
    database, acquired = service.app.state.db, 0
    acquire = database.acquire

    def counted():
        nonlocal acquired
        acquired += 1
        return acquire()

    database.acquire = counted  # every statement of the waiting replica, its background loops' too

    async def acquired_in(seconds):
        before = acquired
        await asyncio.sleep(seconds)
        return acquired - before

    idle = await acquired_in(2)
    created = await b.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(200)]})
    ids = [j["id"] for j in created.json()["jobs"]]
    waiters = [asyncio.create_task(a.get(f"/jobs/{i}", params={"wait": 60})) for i in ids]
    await until(lambda: db.fetchval("SELECT count(*) = 200 FROM jobq.all_jobs WHERE awaited"))
    waiting = await acquired_in(2)
    connections = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'jobq%'"
    )
    assert connections <= 2 * (service.settings.pool_max_size + 1)  # two replicas: pools and listeners
    assert waiting <= idle + 5, (idle, waiting)  # 200 waiters polling would run hundreds more
    leased = (await b.post("/lease", json={"queue": "q", "max_jobs": 200})).json()["jobs"]
    await b.post(
        "/ack/batch", json={"items": [{"id": j["id"], "lease_token": j["lease_token"]} for j in leased]}
    )
    # A waiter the acks' notifications missed would answer only at the end of its 60 s; every one
    # answers long before (on a loaded machine, 200 answers can take seconds).
    answers = await asyncio.wait_for(asyncio.gather(*waiters), 30)
    assert {r.json()["status"] for r in answers} == {"completed"}
    await until(lambda: service.app.state.runtime.wakeups.watchers == 0)


async def test_a_waiter_whose_client_leaves_is_gone_at_once(replicas, b):
    service = replicas[0]
    job = (await b.post("/jobs", json={"queue": "q", "payload": 1})).json()
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as gone:
        waiter = asyncio.create_task(gone.get(f"/jobs/{job['id']}", params={"wait": 30}))
        await until(lambda: service.app.state.runtime.wakeups.watchers == 1)
        waiter.cancel()
    wakeups = service.app.state.runtime.wakeups
    await until(lambda: wakeups.watchers == 0 and wakeups.long_polls == 0)


async def test_a_token_for_other_queues_waits_for_nothing(start_service, database_url, b):
    service = start_service(tokens={"p": {"role": "producer", "queues": ["mine-*"]}}, **QUIET)
    job = (await b.post("/jobs", json={"queue": "theirs", "payload": 1})).json()
    async with httpx.AsyncClient(base_url=service.url, headers={"Authorization": "Bearer p"}) as http:
        started = time.monotonic()
        assert_problem(await http.get(f"/jobs/{job['id']}", params={"wait": 30}), 404, "not_found")
        assert time.monotonic() - started < 1


# --- the Python client -------------------------------------------------------------------------------


async def test_client_wait_and_enqueue_with_wait(replicas):
    from jobq import AsyncClient
    from jobq.types import JobStatus

    async with AsyncClient(replicas[0].url) as waiter, AsyncClient(replicas[1].url) as worker:

        async def work():
            (job,) = await worker.lease("calc", wait=10)
            await asyncio.sleep(0.2)
            await worker.ack(job, {"sum": sum(job.payload)})

        working = asyncio.create_task(work())
        job = await waiter.enqueue("calc", [1, 2, 3], wait=10)  # request and reply in one call
        await working
        assert (job.status, job.result) == (JobStatus.COMPLETED, {"sum": 6})
        assert (await waiter.wait(job.id, 10)).result == {"sum": 6}  # finished: at once

        unfinished = await waiter.enqueue("calc", [1], wait=0.3)
        assert unfinished.status == JobStatus.PENDING
        started = time.monotonic()
        assert (await waiter.wait(unfinished.id, 0.5)).status == JobStatus.PENDING
        assert 0.5 <= time.monotonic() - started < 1.5


async def test_waiting_at_once_does_not_hide_the_job_from_a_waiting_worker(a, b):
    """A producer that enqueues and waits at once marks the job just as the long-poll its enqueue woke
    claims, and a claim passes a row being marked over: marking a pending job wakes a long-poll again,
    so the worker still gets it now, not at the next safety poll (a minute away here)."""
    for i in range(20):
        lease = asyncio.create_task(b.post("/lease", json={"queue": "rr", "wait": 10}))
        await asyncio.sleep(0.05)
        job = (await a.post("/jobs", json={"queue": "rr", "payload": i})).json()
        waiter = asyncio.create_task(a.get(f"/jobs/{job['id']}", params={"wait": 10}))
        (leased,) = (await asyncio.wait_for(lease, 2)).json()["jobs"] or [None]
        assert leased is not None and leased["id"] == job["id"], f"round {i}: the lease found nothing"
        await b.post("/ack", json={"id": leased["id"], "lease_token": leased["lease_token"]})
        assert (await asyncio.wait_for(waiter, 2)).json()["status"] == "completed"


@pytest.mark.slow
async def test_waits_racing_their_acks_all_end_at_once(replicas, a, b):
    """300 waiters start while their jobs are being acked in batches on the other replica: each mark
    either lands before its job's ack (which then notifies) or finds the job finished; none is missed
    and waits out its 60 seconds, and no statement deadlocks."""
    batch = {"jobs": [{"queue": "race", "payload": i} for i in range(300)]}
    created = await b.post("/jobs/batch", json=batch)
    ids = [j["id"] for j in created.json()["jobs"]]
    leased = (await b.post("/lease", json={"queue": "race", "max_jobs": 300})).json()["jobs"]

    async def ack_all():
        for start in range(0, 300, 20):
            items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in leased[start : start + 20]]
            r = await b.post("/ack/batch", json={"items": items})
            assert all(item["ok"] for item in r.json()["results"]), r.text
            await asyncio.sleep(0.005)

    started = time.monotonic()
    waiters = [a.get(f"/jobs/{i}", params={"wait": 60}) for i in ids]
    answers = await asyncio.gather(*waiters, ack_all())
    assert [r.json()["status"] for r in answers[:-1]] == ["completed"] * 300
    assert time.monotonic() - started < 30  # half the wait: no waiter waited it out
