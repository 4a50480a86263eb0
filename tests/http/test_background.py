"""Background work shared by replicas: lease expiry with several services on one database."""

import time

import httpx
import pytest

pytestmark = pytest.mark.anyio


async def _until(predicate, timeout: float = 20.0):
    import anyio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await anyio.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.slow
async def test_lease_expiry_with_three_replicas(start_service, db):
    """2,500 expired leases (more than one expiry batch) with three services expiring leases at once: each job
    comes back exactly once per expiry, then goes dead after its last attempt; none is lost or doubled."""
    services = [start_service() for _ in range(3)]
    total = 2500
    async with httpx.AsyncClient(base_url=services[0].url, timeout=60) as http:
        for start in range(0, total, 1000):
            batch = [
                {"queue": "q", "payload": i, "max_attempts": 2}
                for i in range(start, min(total, start + 1000))
            ]
            assert (await http.post("/jobs/batch", json={"jobs": batch})).status_code == 201

        for attempt in (1, 2):
            leased = 0
            while leased < total:
                r = await http.post("/lease", json={"queue": "q", "max_jobs": 1000, "visibility_timeout": 1})
                leased += len(r.json()["jobs"])
            assert leased == total
            want = "pending" if attempt == 1 else "dead"

            async def all_expired() -> bool:
                return (
                    await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = $1", want) == total
                )

            await _until(all_expired)
            rows = await db.fetch("SELECT attempts, last_error FROM jobq.all_jobs")
            assert len(rows) == total
            assert {r["attempts"] for r in rows} == {attempt}
            assert all(
                "lease expired at" in r["last_error"] and f"attempt {attempt}" in r["last_error"]
                for r in rows
            )

        dead = await http.get("/dead", params={"queue": "q", "limit": 1000})
        assert len(dead.json()["jobs"]) == 1000 and dead.json()["next_before_id"] is not None


def test_the_expiry_interval_is_read_under_its_former_name_too(monkeypatch):
    from app.settings import Settings

    monkeypatch.setenv("JOBQ_SWEEP_INTERVAL", "0.3")
    assert Settings().expire_interval == 0.3
    monkeypatch.setenv("JOBQ_EXPIRE_INTERVAL", "0.4")
    assert Settings().expire_interval == 0.4
