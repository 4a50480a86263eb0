"""Keyed flow control under faults: workers that die holding leases, a replica killed with SIGKILL, on two
service processes. A trigger (test-only, helpers.STATUS_HISTORY) records every status change of every job
in the order the statements ran; from that history: running jobs per key never exceed the limit, and with
a limit of 1 a key's jobs ran in order, each only after the one before it had finished, retries included.

Why the history's order is enough: a claim counts a key's running jobs in a statement that starts after
it holds the key's lock, so a lease is recorded after every end (ack, nack, expiry) it counted as ended
had committed, and so after that end was recorded.

The CI-sized version (thousands of leases); the full size (64 workers, 1,000 keys of 100 jobs each, over
100,000 leases) is the same test at JOBQ_CHAOS_SCALE=20:
    JOBQ_CHAOS_SCALE=20 make test PYTEST_ARGS=tests/system/test_flow_chaos.py"""

from __future__ import annotations

import asyncio
import os
import random
from collections import defaultdict

import asyncpg
import httpx
import pytest

from tests.helpers import STATUS_HISTORY
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.anyio

SCALE = float(os.environ.get("JOBQ_CHAOS_SCALE", "1"))
FULL = SCALE >= 20
PER_KEY, WORKERS = (100, 64) if FULL else (20, 16)
LEASE = 1.0  # seconds: the leases of dead workers come back soon


async def run_chaos(database_url, tmp_path, *, limit: int, keys: int, per_key: int, workers: int) -> list:
    conn = await asyncpg.connect(database_url)
    await conn.execute(STATUS_HISTORY)
    env = {"JOBQ_DATABASE_URL": database_url, "JOBQ_SWEEP_INTERVAL": "0.2"}
    replicas = [ServiceProcess(tmp_path, **env).wait_ready(), ServiceProcess(tmp_path, **env).wait_ready()]
    total = keys * per_key
    try:
        async with httpx.AsyncClient(base_url=replicas[0].url, timeout=10) as http:
            r = await http.patch("/queues/chaos", json={"key_concurrency": limit})
            assert r.status_code == 200, r.text
            jobs = [{"queue": "chaos", "payload": i, "key": f"k{i % keys}"} for i in range(total)]
            for start in range(0, total, 1000):
                r = await http.post("/jobs/batch", json={"jobs": jobs[start : start + 1000]})
                assert r.status_code == 201, r.text

        async def completed() -> int:
            return await conn.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'completed'")

        async def work(n: int) -> None:
            alive = [0, 1] if n % 2 == 0 else [1, 0]
            clients = [httpx.AsyncClient(base_url=r.url, timeout=5) for r in replicas]
            try:
                while True:
                    http = clients[alive[0]]
                    try:
                        r = await http.post(
                            "/lease",
                            json={"queue": "chaos", "max_jobs": 4, "visibility_timeout": LEASE, "wait": 0.2},
                        )
                        for job in r.json()["jobs"] if r.status_code == 200 else []:
                            if random.random() < 0.03:
                                continue  # the worker dies holding it: its lease expires
                            await asyncio.sleep(random.random() * 0.005)
                            await http.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
                    except httpx.TransportError:
                        if len(alive) > 1:
                            alive.pop(0)  # its replica is gone: the other one
                        await asyncio.sleep(0.05)
            finally:
                for client in clients:
                    await client.aclose()

        tasks = [asyncio.create_task(work(n)) for n in range(workers)]
        await asyncio.sleep(2)
        replicas[1].kill()
        for _ in range(int(120 * max(SCALE, 1))):
            if await completed() == total:
                break
            await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert await completed() == total
        return await conn.fetch("SELECT seq, job, key, old, new FROM public.history ORDER BY seq")
    finally:
        for replica in replicas:
            replica.kill()
        await conn.close()


def most_running(history) -> dict[str, int]:
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for event in history:
        if event["new"] == "running":
            running[event["key"]] += 1
            most[event["key"]] = max(most[event["key"]], running[event["key"]])
        elif event["old"] == "running":
            running[event["key"]] -= 1
    return most


async def test_key_concurrency_holds_through_dead_workers_and_a_killed_replica(database_url, tmp_path):
    keys = int(50 * SCALE)
    history = await run_chaos(database_url, tmp_path, limit=2, keys=keys, per_key=PER_KEY, workers=WORKERS)
    most = most_running(history)
    assert len(most) == keys and max(most.values()) == 2, sorted(most.items(), key=lambda kv: -kv[1])[:5]
    assert sum(1 for e in history if e["new"] == "running") >= keys * PER_KEY
    assert any(e["old"] == "running" and e["new"] == "pending" for e in history), "no lease expired"


async def test_in_order_keys_run_one_job_after_another_through_faults(database_url, tmp_path):
    keys = int(50 * SCALE) if FULL else 20
    history = await run_chaos(
        database_url, tmp_path, limit=1, keys=keys, per_key=PER_KEY if FULL else 15, workers=WORKERS
    )
    assert max(most_running(history).values()) == 1
    per_key: dict[str, list] = defaultdict(list)
    for event in history:
        per_key[event["key"]].append(event)
    for key, events in per_key.items():
        leased = [e["job"] for e in events if e["new"] == "running"]
        firsts = list(dict.fromkeys(leased))  # each job at its first lease
        assert firsts == sorted(firsts), f"{key}: jobs leased out of order: {firsts}"
        # A job's leases all come before the next job's first: retries are not overtaken.
        assert leased == sorted(leased), f"{key}: a later job ran before a retry: {leased}"
