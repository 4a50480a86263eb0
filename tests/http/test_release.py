"""POST /release: leased jobs go back to pending at once, the attempt not counted, fenced by the token."""

import pytest

pytestmark = pytest.mark.anyio


async def test_release_gives_jobs_back_uncounted(client, db):
    await client.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(3)]})
    leased = (await client.post("/lease", json={"queue": "q", "max_jobs": 3})).json()["jobs"]
    keep, give = leased[0], leased[1:]
    items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in give]
    items.append({"id": keep["id"], "lease_token": "not-the-token"})
    items.append({"id": 999_999, "lease_token": keep["lease_token"]})
    r = await client.post("/release", json={"items": items})
    assert r.status_code == 200
    assert r.json()["results"] == [
        {"id": give[0]["id"], "ok": True},
        {"id": give[1]["id"], "ok": True},
        {"id": keep["id"], "ok": False, "code": "lease_lost"},
        {"id": 999_999, "ok": False, "code": "not_found"},
    ]
    rows = {r["id"]: r for r in await db.fetch("SELECT id, status, attempts, lease_token FROM jobq.all_jobs")}
    for job in give:
        assert (rows[job["id"]]["status"], rows[job["id"]]["attempts"]) == ("pending", 0)
        assert rows[job["id"]]["lease_token"] is None
    assert (rows[keep["id"]]["status"], rows[keep["id"]]["attempts"]) == ("running", 1)

    # The released token is spent: it can neither ack nor release again.
    again = await client.post("/release", json={"items": items[:1]})
    assert again.json()["results"] == [{"id": give[0]["id"], "ok": False, "code": "lease_lost"}]
    ack = await client.post("/ack", json=items[0])
    assert ack.status_code == 409
    # ...and another worker gets the jobs at once, on their first attempt.
    relet = (await client.post("/lease", json={"queue": "q", "max_jobs": 5})).json()["jobs"]
    assert sorted(j["id"] for j in relet) == sorted(j["id"] for j in give)
    assert {j["attempts"] for j in relet} == {1}


async def test_release_on_the_last_attempt_does_not_kill_the_job(client, db):
    await client.post("/jobs", json={"queue": "q", "payload": 1, "max_attempts": 1})
    (job,) = (await client.post("/lease", json={"queue": "q"})).json()["jobs"]
    r = await client.post("/release", json={"items": [{"id": job["id"], "lease_token": job["lease_token"]}]})
    assert r.json()["results"] == [{"id": job["id"], "ok": True}]
    assert await db.fetchval("SELECT status FROM jobq.all_jobs") == "pending"


async def test_the_python_client_releases(service, db):
    from jobq import AsyncClient

    async with AsyncClient(service.url) as jobq:
        await jobq.enqueue("q", {"n": 1})
        (job,) = await jobq.lease("q")
        (result,) = await jobq.release([job])
        assert (result.id, result.ok) == (job.id, True)
        (again,) = await jobq.release([job])
        assert (again.ok, again.code) == (False, "lease_lost")
    row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs")
    assert (row["status"], row["attempts"]) == ("pending", 0)
