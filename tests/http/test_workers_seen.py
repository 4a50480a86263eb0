"""GET /workers and the workers page: workers known by the worker_id they lease with, written by each
replica every metrics interval (app/service/workers_seen.py)."""

import httpx
import pytest

from tests.helpers import enqueue
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def _workers(http: httpx.AsyncClient) -> dict[str, dict]:
    r = await http.get("/workers")
    assert r.status_code == 200, r.text
    return {w["worker_id"]: w for w in r.json()["workers"]}


async def test_workers_seen_with_what_they_hold(start_service, db):
    service = start_service(metrics_interval=0.1, prune_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        assert await _workers(http) == {}
        for _ in range(3):
            await enqueue(http, "emails")
        r = await http.post("/lease", json={"queue": "emails", "max_jobs": 2, "worker_id": "host-a:1"})
        held = r.json()["jobs"]
        assert len(held) == 2
        await http.post("/lease", json={"queue": "reports", "worker_id": "host-b:2"})  # nothing to lease
        await http.post("/lease", json={"queue": "emails"})  # no worker_id: not kept

        seen = await until(lambda: _two(http))
        a, b = seen["host-a:1"], seen["host-b:2"]
        assert (a["queues"], a["leased"], a["held"]) == (["emails"], 2, 2)
        assert a["next_deadline"] is not None and a["last_seen"] is not None
        assert (b["queues"], b["leased"], b["held"]) == (["reports"], 0, 0)
        assert await db.fetchval("SELECT count(*) FROM jobq.workers") == 2

        # An ack frees what it held; a worker seen again has its leases added up.
        await http.post("/ack", json={"id": held[0]["id"], "lease_token": held[0]["lease_token"]})
        await enqueue(http, "emails")
        r = await http.post("/lease", json={"queue": "emails", "worker_id": "host-a:1"})
        assert len(r.json()["jobs"]) == 1
        a = await until(lambda: _leased(http, "host-a:1", 3))
        assert a["held"] == 2  # one acked, one more leased

        # Not seen for an hour: forgotten, unless it still holds jobs (then listed, without last_seen).
        await db.execute("UPDATE jobq.workers SET last_seen = now() - interval '2 hours'")
        await until(lambda: db.fetchval("SELECT count(*) = 0 FROM jobq.workers"))
        seen = await _workers(http)
        assert list(seen) == ["host-a:1"]
        assert (seen["host-a:1"]["last_seen"], seen["host-a:1"]["held"]) == (None, 2)


async def _two(http):
    seen = await _workers(http)
    return seen if {"host-a:1", "host-b:2"} <= seen.keys() else None


async def _leased(http, worker, n):
    seen = await _workers(http)
    return seen[worker] if seen.get(worker, {}).get("leased") == n else None


async def test_a_job_names_the_worker_of_its_latest_lease(client):
    job = await enqueue(client, "q")
    assert job["worker_id"] is None
    r = await client.post("/lease", json={"queue": "q", "worker_id": "host-a:7"})
    (held,) = r.json()["jobs"]
    assert (await client.get(f"/jobs/{job['id']}")).json()["worker_id"] == "host-a:7"
    await client.post("/ack", json={"id": held["id"], "lease_token": held["lease_token"]})
    done = (await client.get(f"/jobs/{job['id']}")).json()
    assert (done["status"], done["worker_id"]) == ("completed", "host-a:7")  # who ran it stays told

    other = await enqueue(client, "q")
    r = await client.post("/lease", json={"queue": "q", "worker_id": "host-b:8"})
    (held,) = r.json()["jobs"]
    await client.post("/release", json={"items": [{"id": held["id"], "lease_token": held["lease_token"]}]})
    assert (await client.get(f"/jobs/{other['id']}")).json()["worker_id"] is None  # released: nobody's
