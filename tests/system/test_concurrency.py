"""Concurrency: many workers draining one queue, concurrent dedup enqueues, many long-polls woken at once.

Every worker has its own httpx.AsyncClient and runs as an asyncio task against a real service. Leases are
long (60 s), so no job may be redelivered: each job id must be handed out exactly once, and no two workers
may ever hold the same job.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx
import pytest

from tests.helpers import enqueue_many

pytestmark = pytest.mark.anyio

TOTAL = 2000
WORKERS = 8


class Ledger:
    """What the workers saw: every (id, token) handed out, and who holds what right now."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[int, str, int]] = []  # (job id, lease token, worker)
        self.held: dict[int, int] = {}  # job id -> worker holding it now
        self.overlaps: list[tuple[int, int, int]] = []  # (job id, holder, newcomer)
        self.acked: Counter[int] = Counter()

    def take(self, worker: int, job: dict) -> None:
        self.deliveries.append((job["id"], job["lease_token"], worker))
        if job["id"] in self.held:
            self.overlaps.append((job["id"], self.held[job["id"]], worker))
        self.held[job["id"]] = worker

    def release(self, worker: int, job_id: int) -> None:
        assert self.held.get(job_id) == worker, (job_id, self.held.get(job_id), worker)
        del self.held[job_id]
        self.acked[job_id] += 1


async def drain(url: str, queue: str, ledger: Ledger, *, single: bool) -> None:
    """Run WORKERS workers until the queue is empty.

    `single`: leases of one job each; a worker holds 1..10 of them, then acks them in one /ack/batch."""

    async def ack_batch(client: httpx.AsyncClient, n: int, jobs: list[dict]) -> None:
        items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in jobs]
        r = await client.post("/ack/batch", json={"items": items})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["id"] for x in results] == [j["id"] for j in jobs]
        assert all(x["ok"] is True for x in results), results
        for job in jobs:
            ledger.release(n, job["id"])

    async def worker(n: int) -> None:
        rng = random.Random(n)
        held: list[dict] = []  # single mode: leased one at a time, acked together
        batch = rng.randint(1, 10)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            while True:
                max_jobs = 1 if single else rng.randint(1, 10)
                body = {"queue": queue, "max_jobs": max_jobs, "visibility_timeout": 60, "worker_id": f"w{n}"}
                r = await client.post("/lease", json=body)
                assert r.status_code == 200, r.text
                jobs = r.json()["jobs"]
                assert len(jobs) <= max_jobs
                for job in jobs:
                    assert job["attempts"] == 1, job
                    ledger.take(n, job)
                if single:
                    held.extend(jobs)
                    if held and (not jobs or len(held) >= batch):
                        await ack_batch(client, n, held)
                        held, batch = [], rng.randint(1, 10)
                else:
                    for job in jobs:
                        body = {"id": job["id"], "lease_token": job["lease_token"]}
                        r = await client.post("/ack", json=body)
                        assert r.status_code == 200, r.text
                        assert r.json() == {"id": job["id"], "status": "completed"}
                        ledger.release(n, job["id"])
                if not jobs:
                    return

    await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(WORKERS))), timeout=50)


async def check_drained(db, queue: str, ids: list[int], ledger: Ledger) -> None:
    delivered = Counter(job_id for job_id, _, _ in ledger.deliveries)
    assert not ledger.overlaps, ledger.overlaps[:10]
    assert len(ledger.deliveries) == len(ids), (len(ledger.deliveries), len(ids))
    assert set(delivered) == set(ids)
    assert [job_id for job_id, n in delivered.items() if n != 1] == []
    assert len({token for _, token, _ in ledger.deliveries}) == len(ids)  # a fresh token per lease
    assert ledger.held == {}
    assert set(ledger.acked) == set(ids) and set(ledger.acked.values()) == {1}
    assert len({w for _, _, w in ledger.deliveries}) > 1  # the work was actually shared
    rows = await db.fetch(
        "SELECT status, attempts, count(*) AS n, count(completed_at) AS done FROM jobq.all_jobs"
        " WHERE queue = $1 GROUP BY status, attempts",
        queue,
    )
    assert [(r["status"], r["attempts"], r["n"], r["done"]) for r in rows] == [
        ("completed", 1, len(ids), len(ids))
    ]
    tokens = await db.fetch(
        "SELECT id, lease_token::text || '.' || queue AS t FROM jobq.all_jobs WHERE queue = $1", queue
    )
    assert {(r["id"], r["t"]) for r in tokens} == {(job_id, token) for job_id, token, _ in ledger.deliveries}


async def test_many_workers_drain_each_job_exactly_once(client, db, service):
    ids = await enqueue_many(client, "drain", TOTAL)
    ledger = Ledger()
    await drain(service.url, "drain", ledger, single=False)
    await check_drained(db, "drain", ids, ledger)


async def test_single_job_leases_acked_in_batches(client, db, service):
    ids = await enqueue_many(client, "single", TOTAL)
    ledger = Ledger()
    await drain(service.url, "single", ledger, single=True)
    await check_drained(db, "single", ids, ledger)


async def test_concurrent_enqueues_with_same_dedup_key_create_one_job(client, db, service):
    async def one(n: int) -> httpx.Response:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as c:
            return await c.post("/jobs", json={"queue": "dedup", "payload": {"n": n}, "dedup_key": "same"})

    answers = await asyncio.gather(*(one(n) for n in range(20)))
    assert sorted(r.status_code for r in answers) == [200] * 19 + [201], [r.text for r in answers]
    bodies = [r.json() for r in answers]
    assert len({b["id"] for b in bodies}) == 1
    created = next(b for r, b in zip(answers, bodies, strict=False) if r.status_code == 201)
    assert created["duplicate"] is False
    assert all(b["duplicate"] is True for r, b in zip(answers, bodies, strict=False) if r.status_code == 200)
    assert all(b["payload"] == created["payload"] and b["dedup_key"] == "same" for b in bodies)
    rows = await db.fetch("SELECT id, status, payload FROM jobq.all_jobs WHERE queue = 'dedup'")
    assert [(r["id"], r["status"]) for r in rows] == [(created["id"], "pending")]


async def test_waiting_leases_each_get_a_different_job(client, db, service):
    callers, total = 20, 20

    async def waiter(n: int) -> tuple[list[dict], float]:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as c:
            r = await c.post("/lease", json={"queue": "wake", "wait": 10, "visibility_timeout": 60})
            assert r.status_code == 200, r.text
            return r.json()["jobs"], time.monotonic()

    tasks = [asyncio.create_task(waiter(n)) for n in range(callers)]
    await asyncio.sleep(0.5)  # let every caller reach its long-poll
    assert not any(t.done() for t in tasks)
    enqueued_at = time.monotonic()
    batch = [{"queue": "wake", "payload": n} for n in range(total)]
    r = await client.post("/jobs/batch", json={"jobs": batch})
    assert r.status_code == 201, r.text
    ids = [j["id"] for j in r.json()["jobs"]]
    done = await asyncio.wait_for(asyncio.gather(*tasks), timeout=15)

    delivered = [job["id"] for jobs, _ in done for job in jobs]
    assert sorted(delivered) == sorted(ids)  # every job, each to exactly one caller
    assert [len(jobs) for jobs, _ in done] == [1] * callers
    assert len({job["lease_token"] for jobs, _ in done for job in jobs}) == total
    assert max(at for _, at in done) - enqueued_at < 5  # woken, not timed out
    rows = await db.fetch(
        "SELECT status, attempts, count(*) AS n FROM jobq.all_jobs GROUP BY status, attempts"
    )
    assert [(r["status"], r["attempts"], r["n"]) for r in rows] == [("running", 1, total)]
