"""Several service processes on one database: wake-ups cross replicas, work is shared exactly once,
and a replica stopped with SIGTERM answers its waiters at once and exits cleanly."""

import asyncio
import signal
import time

import httpx
import pytest

from tests.service_process import ServiceProcess

pytestmark = pytest.mark.anyio


@pytest.fixture
def replicas(database_url, tmp_path):
    started = [ServiceProcess(tmp_path, JOBQ_DATABASE_URL=database_url) for _ in range(3)]
    try:
        yield [s.wait_ready() for s in started]
    finally:
        for s in started:
            s.kill()


async def test_enqueue_on_one_replica_wakes_a_waiter_on_another(replicas):
    a, b, _ = replicas
    latencies = []
    async with httpx.AsyncClient(base_url=a.url) as on_a, httpx.AsyncClient(base_url=b.url) as on_b:
        for i in range(10):
            waiting = asyncio.create_task(on_b.post("/lease", json={"queue": "x", "wait": 10}))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            await on_a.post("/jobs", json={"queue": "x", "payload": i})
            (job,) = (await waiting).json()["jobs"]
            latencies.append(time.monotonic() - started)
            assert job["payload"] == i
            await on_b.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
    # Woken by the enqueue's notification, not found by the safety net's look every 5 s: were it so, each
    # of the ten would have one chance in five to come within a second. (How fast a wake-up is, the
    # benchmark measures: bench/pickup.py.)
    assert max(latencies) < 1.0, latencies


async def test_workers_over_three_replicas_drain_5000_jobs_exactly_once(replicas, db):
    total = 5000
    async with httpx.AsyncClient(base_url=replicas[0].url, timeout=30) as producer:
        for start in range(0, total, 1000):
            jobs = [{"queue": "drain", "payload": n} for n in range(start, start + 1000)]
            assert (await producer.post("/jobs/batch", json={"jobs": jobs})).status_code == 201

    delivered: list[int] = []

    async def worker(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while True:
                r = await http.post("/lease", json={"queue": "drain", "max_jobs": 25, "wait": 0.5})
                jobs = r.json()["jobs"]
                if not jobs:
                    return
                delivered.extend(j["id"] for j in jobs)
                items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in jobs]
                results = (await http.post("/ack/batch", json={"items": items})).json()["results"]
                assert all(r["ok"] for r in results)

    await asyncio.gather(*(worker(replicas[i % 3].url) for i in range(12)))
    assert len(delivered) == total and len(set(delivered)) == total
    counts = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'completed') AS completed, max(attempts) AS most"
        " FROM jobq.all_jobs"
    )
    assert (counts["completed"], counts["most"]) == (total, 1)


async def test_expiry_with_all_replicas_up_wakes_waiters_elsewhere(replicas, db):
    a, _, c = replicas
    async with httpx.AsyncClient(base_url=a.url) as on_a, httpx.AsyncClient(base_url=c.url) as on_c:
        await on_a.post("/jobs/batch", json={"jobs": [{"queue": "e", "payload": i} for i in range(300)]})
        leased = (
            await on_a.post("/lease", json={"queue": "e", "max_jobs": 300, "visibility_timeout": 1})
        ).json()
        assert len(leased["jobs"]) == 300  # and never acked: a vanished worker
        started = time.monotonic()
        again = (await on_c.post("/lease", json={"queue": "e", "max_jobs": 300, "wait": 10})).json()["jobs"]
        assert again and time.monotonic() - started < 2.5
        assert {j["attempts"] for j in again} == {2}
    rows = await db.fetch("SELECT status, attempts FROM jobq.all_jobs")
    assert len(rows) == 300 and all(r["attempts"] in (1, 2) for r in rows)


async def test_sigterm_answers_waiters_at_once_and_exits(replicas, db):
    service = replicas[0]
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        waiting = [
            asyncio.create_task(http.post("/lease", json={"queue": "idle", "wait": 30})) for _ in range(20)
        ]
        await asyncio.sleep(0.5)
        started = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*waiting)
        answered_in = time.monotonic() - started
    assert [a.status_code for a in answers] == [200] * 20
    assert all(a.json() == {"jobs": []} for a in answers)
    assert answered_in < 2.0
    returncode = await asyncio.to_thread(service.process.wait, 10)
    assert ServiceProcess.clean_exit(returncode)
    assert time.monotonic() - started < 5.0
    # Its connections are gone; the other replicas' remain.
    assert await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()") >= 2
