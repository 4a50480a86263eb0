import pytest

pytestmark = pytest.mark.anyio


async def test_enqueue_lease_ack(client, db):
    r = await client.post("/jobs", json={"queue": "q", "payload": {"a": 1}})
    assert r.status_code == 201, r.text
    job = r.json()
    r = await client.post("/lease", json={"queue": "q"})
    (leased,) = r.json()["jobs"]
    assert leased["id"] == job["id"]
    r = await client.post("/ack", json={"id": job["id"], "lease_token": leased["lease_token"]})
    assert r.json() == {"id": job["id"], "status": "completed"}
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job["id"]) == "completed"
