"""Bearer tokens and roles: producer, worker, admin. 401 and 403 are problem bodies; nothing changes."""

import pytest

from tests.helpers import assert_problem, bearer

pytestmark = pytest.mark.anyio

TOKENS = {"p-secret": "producer", "w-secret": "worker", "a-secret": "admin"}


@pytest.fixture
async def secured(start_service):
    import httpx

    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        yield http


def assert_refused(r, status: int, code: str) -> None:
    """A problem answer that shows none of the tokens."""
    assert_problem(r, status, code)
    assert "secret" not in r.text


async def test_no_token_is_401_and_changes_nothing(secured, db):
    for r in (
        await secured.post("/jobs", json={"queue": "q", "payload": 1}),
        await secured.post("/lease", json={"queue": "q"}),
        await secured.get("/queues"),
        await secured.get("/jobs/1"),
    ):
        assert_refused(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_wrong_token_and_wrong_scheme_are_401(secured):
    assert_refused(await secured.get("/queues", headers=bearer("guess")), 401, "unauthorized")
    assert_refused(await secured.get("/queues", headers={"Authorization": "Basic YTpi"}), 401, "unauthorized")
    assert_refused(await secured.get("/queues", headers={"Authorization": "Bearer"}), 401, "unauthorized")


async def test_roles(secured, db):
    producer, worker, admin = bearer("p-secret"), bearer("w-secret"), bearer("a-secret")

    r = await secured.post("/jobs", json={"queue": "q", "payload": 1}, headers=producer)
    assert r.status_code == 201
    job_id = r.json()["id"]
    assert (
        await secured.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 2}]}, headers=producer)
    ).status_code == 201
    assert_refused(
        await secured.post("/jobs", json={"queue": "q", "payload": 3}, headers=worker), 403, "forbidden"
    )
    assert_refused(await secured.post("/lease", json={"queue": "q"}, headers=producer), 403, "forbidden")
    assert_refused(await secured.get("/queues", headers=producer), 403, "forbidden")
    assert_refused(await secured.get("/dead", headers=worker), 403, "forbidden")
    assert_refused(await secured.delete(f"/jobs/{job_id}", headers=producer), 403, "forbidden")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 2  # the refused enqueue left nothing

    # Both producers and workers read jobs.
    assert (await secured.get(f"/jobs/{job_id}", headers=producer)).status_code == 200
    assert (await secured.get(f"/jobs/{job_id}", headers=worker)).status_code == 200

    (job,) = (await secured.post("/lease", json={"queue": "q"}, headers=worker)).json()["jobs"]
    ack = {"id": job["id"], "lease_token": job["lease_token"]}
    assert_refused(await secured.post("/ack", json=ack, headers=producer), 403, "forbidden")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job["id"]) == "running"
    assert (await secured.post("/ack", json=ack, headers=worker)).status_code == 200

    # Admin does everything.
    assert (await secured.get("/queues", headers=admin)).status_code == 200
    assert (await secured.post("/jobs", json={"queue": "q", "payload": 4}, headers=admin)).status_code == 201
    assert (await secured.post("/lease", json={"queue": "q"}, headers=admin)).status_code == 200
    assert (await secured.post("/queues/q/pause", headers=admin)).status_code == 200


async def test_health_needs_no_token(secured):
    assert (await secured.get("/healthz")).status_code == 200
    assert (await secured.get("/readyz")).status_code == 200


async def test_tokens_file(start_service, tmp_path):
    import httpx

    path = tmp_path / "tokens"
    path.write_text("# role token\nadmin file-admin\nworker file-worker\n")
    service = start_service(tokens_file=path)
    async with httpx.AsyncClient(base_url=service.url) as http:
        assert (await http.get("/queues", headers=bearer("file-admin"))).status_code == 200
        assert (await http.get("/queues", headers=bearer("file-worker"))).status_code == 403
        assert (await http.get("/queues")).status_code == 401


async def test_without_tokens_everything_is_open(client):
    assert (await client.get("/queues")).status_code == 200
