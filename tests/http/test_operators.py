"""Operators: dead letters, queues, health, retention (the HTTP contract, see docs/reference/api.md)."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.helpers import assert_problem, enqueue, lease, lease_one, make_dead, status_of

pytestmark = pytest.mark.anyio

ROW_KEYS = {
    "queue",
    "pending",
    "scheduled",
    "running",
    "dead",
    "completed",
    "oldest_pending_age_seconds",
    "paused",
}
DEFAULTS = {
    "visibility_timeout": 30,
    "max_attempts": 5,
    "backoff_base": 30,
    "backoff_cap": 3600,
    "retention": 86400,
    "key_concurrency": None,
    "fair": False,
    "rate": None,
    "key_rate": None,
}


async def complete(client, queue: str = "q", **body) -> dict:
    job = await enqueue(client, queue, **body)
    leased = await lease_one(client, queue, job["id"])
    r = await client.post("/ack", json={"id": job["id"], "lease_token": leased["lease_token"]})
    assert r.status_code == 200, r.text
    return job


async def queue_row(client, name: str) -> dict:
    r = await client.get("/queues")
    assert r.status_code == 200, r.text
    rows = [x for x in r.json() if x["queue"] == name]
    assert len(rows) == 1, r.json()
    return rows[0]


# --- GET /dead -------------------------------------------------------------------------------------


async def test_dead_list_newest_first_with_error_and_attempts(client, db):
    ids = [await make_dead(client, error=f"err {i}") for i in range(3)]
    await enqueue(client)  # a pending job is not listed
    await complete(client, "other")  # nor a completed one
    r = await client.get("/dead")
    assert r.status_code == 200, r.text
    page = r.json()
    assert [j["id"] for j in page["jobs"]] == ids[::-1]
    assert page["next_before_id"] is None
    for i, j in zip(range(2, -1, -1), page["jobs"], strict=False):
        assert j["status"] == "dead" and j["last_error"] == f"err {i}" and j["attempts"] == 1
        assert j["queue"] == "q" and j["max_attempts"] == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'dead'") == 3


async def test_dead_list_shows_kind(client, db):
    with_kind = await make_dead(client, kind="send_email")
    without = await make_dead(client)
    page = (await client.get("/dead")).json()
    assert [(j["id"], j["kind"]) for j in page["jobs"]] == [(without, None), (with_kind, "send_email")]
    page = (await client.get("/dead", params={"queue": "q"})).json()
    assert [j["kind"] for j in page["jobs"]] == [None, "send_email"]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'dead'") == 2


async def test_dead_nack_dead_true(client, db):
    job = await enqueue(client, max_attempts=5)
    leased = await lease_one(client, "q", job["id"])
    r = await client.post(
        "/nack", json={"id": job["id"], "lease_token": leased["lease_token"], "dead": True, "error": "poison"}
    )
    assert r.status_code == 200 and r.json()["status"] == "dead", r.text
    (listed,) = (await client.get("/dead")).json()["jobs"]
    assert listed["id"] == job["id"] and listed["last_error"] == "poison" and listed["attempts"] == 1


async def test_dead_paging(client):
    ids = [await make_dead(client) for _ in range(5)]
    r = await client.get("/dead", params={"limit": 2})
    assert r.status_code == 200, r.text
    p1 = r.json()
    assert [j["id"] for j in p1["jobs"]] == [ids[4], ids[3]]
    assert p1["next_before_id"] == ids[3]
    p2 = (await client.get("/dead", params={"limit": 2, "before_id": p1["next_before_id"]})).json()
    assert [j["id"] for j in p2["jobs"]] == [ids[2], ids[1]]
    p3 = (await client.get("/dead", params={"limit": 2, "before_id": p2["next_before_id"]})).json()
    assert [j["id"] for j in p3["jobs"]] == [ids[0]]
    assert p3["next_before_id"] is None
    # following the cursor with another page size visits each job once
    seen, before = [], None
    for _ in range(10):
        params = {"limit": 1} | ({"before_id": before} if before else {})
        page = (await client.get("/dead", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
    assert seen == ids[::-1]


async def test_dead_filter_by_queue(client):
    a = [await make_dead(client, "a") for _ in range(2)]
    b = [await make_dead(client, "b") for _ in range(2)]
    page = (await client.get("/dead", params={"queue": "a"})).json()
    assert [j["id"] for j in page["jobs"]] == a[::-1]
    page = (await client.get("/dead", params={"queue": "b", "limit": 1})).json()
    assert [j["id"] for j in page["jobs"]] == [b[1]]
    assert [j["id"] for j in (await client.get("/dead")).json()["jobs"]] == [b[1], b[0], a[1], a[0]]
    await enqueue(client, "c")  # a queue without dead jobs: an empty page
    assert (await client.get("/dead", params={"queue": "c"})).json() == {"jobs": [], "next_before_id": None}
    assert (await client.post("/dead/retry", json={"queue": "c"})).json() == {"retried": 0, "skipped": []}


async def test_a_filter_on_a_queue_that_does_not_exist_is_404(client, db):
    """Naming a queue nobody used is a mistake worth saying, not an empty answer."""
    problem = assert_problem(await client.get("/dead", params={"queue": "nobody"}), 404, "not_found")
    assert problem["detail"] == "queue 'nobody' does not exist (no jobs, no settings)"
    assert_problem(await client.post("/dead/retry", json={"queue": "nobody"}), 404, "not_found")
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'nobody'") == 0


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": "x"},
        {"before_id": "abc"},
        {"before_id": 2**63},
        {"queue": "bad name"},
        {"queue": ""},
    ],
)
async def test_dead_bad_params(client, params):
    assert_problem(await client.get("/dead", params=params), 422, "validation_error")


# --- POST /dead/retry ------------------------------------------------------------------------------


async def test_retry_by_ids(client, db):
    job = await enqueue(client, max_attempts=2, run_at="2000-01-01T00:00:00Z")
    for _ in range(2):
        leased = await lease_one(client, "q", job["id"])
        r = await client.post(
            "/nack",
            json={"id": job["id"], "lease_token": leased["lease_token"], "retry_after": 0, "error": "e"},
        )
        assert r.status_code == 200, r.text
    assert r.json()["status"] == "dead"
    other = await make_dead(client, "q")
    assert (await db.fetchrow("SELECT attempts FROM jobq.all_jobs WHERE id = $1", job["id"]))["attempts"] == 2

    r = await client.post("/dead/retry", json={"ids": [job["id"]]})
    assert r.status_code == 200, r.text
    assert r.json()["retried"] == 1 and r.json()["skipped"] == []
    rec = await db.fetchrow("SELECT *, now() AS db_now FROM jobq.all_jobs WHERE id = $1", job["id"])
    assert rec["status"] == "pending" and rec["attempts"] == 0
    assert abs((rec["run_at"] - rec["db_now"]).total_seconds()) < 5
    assert rec["lease_token"] is None and rec["lease_expires_at"] is None
    assert await status_of(db, other) == "dead"
    got = (await client.get(f"/jobs/{job['id']}")).json()
    assert got["status"] == "pending" and got["attempts"] == 0
    (leased,) = await lease(client)
    assert leased["id"] == job["id"] and leased["attempts"] == 1
    assert [j["id"] for j in (await client.get("/dead")).json()["jobs"]] == [other]


async def test_retry_by_queue(client, db):
    a = [await make_dead(client, "a") for _ in range(3)]
    b = await make_dead(client, "b")
    r = await client.post("/dead/retry", json={"queue": "a"})
    assert r.status_code == 200, r.text
    assert r.json()["retried"] == 3 and r.json()["skipped"] == []
    assert [await status_of(db, i) for i in a] == ["pending"] * 3
    assert await status_of(db, b) == "dead"
    assert sorted(j["id"] for j in await lease(client, "a", max_jobs=10)) == a
    r = await client.post("/dead/retry", json={"queue": "a"})
    assert r.status_code == 200 and r.json()["retried"] == 0, r.text


async def test_retry_ignores_jobs_that_are_not_dead(client, db):
    pending = await enqueue(client, "p", delay=3600)
    before = dict(await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", pending["id"]))
    r = await client.post("/dead/retry", json={"ids": [pending["id"], 987654]})
    assert r.status_code == 200, r.text
    assert r.json()["retried"] == 0
    assert dict(await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", pending["id"])) == before


async def test_retry_skips_dead_job_whose_dedup_key_is_held(client, db):
    dead = await make_dead(client, dedup_key="k")
    free = await make_dead(client, dedup_key="free")
    holder = await enqueue(client, dedup_key="k", delay=3600)
    assert holder["id"] != dead and holder["duplicate"] is False
    r = await client.post("/dead/retry", json={"ids": [dead, free]})
    assert r.status_code == 200, r.text
    assert r.json()["retried"] == 1 and r.json()["skipped"] == [dead]
    assert await status_of(db, dead) == "dead"
    assert await status_of(db, free) == "pending"
    assert await status_of(db, holder["id"]) == "pending"
    r = await client.post("/dead/retry", json={"queue": "q"})
    assert r.status_code == 200, r.text
    assert r.json()["retried"] == 0 and r.json()["skipped"] == [dead]
    assert await status_of(db, dead) == "dead"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"ids": []},
        {"ids": ["x"]},
        {"ids": [0]},
        {"queue": "bad name"},
        {"queue": "q", "extra": 1},
        [],
        {"ids": None, "queue": None},
    ],
)
async def test_retry_bad_bodies(client, db, body):
    await make_dead(client)
    assert_problem(await client.post("/dead/retry", json=body), 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'dead'") == 1


# --- DELETE /dead/{id} -----------------------------------------------------------------------------


async def test_purge_dead(client, db):
    job_id = await make_dead(client)
    keep = await make_dead(client)
    r = await client.delete(f"/dead/{job_id}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == job_id
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE id = $1", job_id) == 0
    assert await status_of(db, keep) == "dead"
    assert_problem(await client.get(f"/jobs/{job_id}"), 404, "not_found")
    assert_problem(await client.delete(f"/dead/{job_id}"), 404, "not_found")


async def test_purge_non_dead_is_conflict(client, db):
    pending = await enqueue(client, "p")
    done = await complete(client, "c")
    for job in (pending, done):
        before = dict(await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", job["id"]))
        assert_problem(await client.delete(f"/dead/{job['id']}"), 409, "conflict")
        assert dict(await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", job["id"])) == before


async def test_purge_unknown_and_bad_id(client):
    assert_problem(await client.delete("/dead/123456"), 404, "not_found")
    assert_problem(await client.delete("/dead/abc"), 422, "validation_error")
    assert_problem(await client.delete(f"/dead/{2**63}"), 422, "validation_error")


# --- queues ----------------------------------------------------------------------------------------


async def test_queue_rows_count_every_state(client, db):
    await make_dead(client, "s")
    await complete(client, "s")
    running = await enqueue(client, "s")
    await lease_one(client, "s", running["id"])
    old = await enqueue(client, "s")
    await enqueue(client, "s")
    await enqueue(client, "s", delay=3600)
    cancelled = await enqueue(client, "s")
    assert (await client.delete(f"/jobs/{cancelled['id']}")).status_code == 200
    await db.execute(
        "UPDATE jobq.jobs SET run_at = now() - interval '100 seconds', "
        "created_at = now() - interval '100 seconds' WHERE id = $1",
        old["id"],
    )
    await enqueue(client, "t")

    row = await queue_row(client, "s")
    assert ROW_KEYS <= row.keys()
    assert {k: row[k] for k in ("pending", "scheduled", "running", "dead", "completed", "paused")} == {
        "pending": 2,
        "scheduled": 1,
        "running": 1,
        "dead": 1,
        "completed": 1,
        "paused": False,
    }
    assert 99 <= row["oldest_pending_age_seconds"] < 130
    t = await queue_row(client, "t")
    assert (t["pending"], t["scheduled"], t["running"], t["dead"], t["completed"]) == (1, 0, 0, 0, 0)
    assert 0 <= t["oldest_pending_age_seconds"] < 10

    r = await client.get("/queues/s")
    assert r.status_code == 200, r.text
    detail = r.json()
    assert {k: detail[k] for k in ROW_KEYS if k != "oldest_pending_age_seconds"} == {
        k: row[k] for k in ROW_KEYS if k != "oldest_pending_age_seconds"
    }
    assert detail["settings"] == DEFAULTS


async def test_queue_without_ready_jobs_has_zero_age(client):
    await enqueue(client, "z", delay=3600)
    row = await queue_row(client, "z")
    assert row["pending"] == 0 and row["scheduled"] == 1 and row["oldest_pending_age_seconds"] == 0


async def test_unknown_queue_404(client, db):
    assert_problem(await client.get("/queues/nobody"), 404, "not_found")
    assert_problem(await client.get("/queues/bad%20name"), 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0
    assert (await client.get("/queues")).json() == []


async def test_patch_queue_changes_some_keeps_others(client, db):
    r = await client.patch("/queues/cfg", json={"visibility_timeout": 10, "retention": 0.5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["settings"] == DEFAULTS | {"visibility_timeout": 10, "retention": 0.5}
    assert body["queue"] == "cfg" and body["pending"] == 0 and body["paused"] is False
    r = await client.patch("/queues/cfg", json={"max_attempts": 3, "backoff_base": 1.5, "backoff_cap": 60})
    assert r.status_code == 200, r.text
    want = DEFAULTS | {
        "visibility_timeout": 10,
        "max_attempts": 3,
        "backoff_base": 1.5,
        "backoff_cap": 60,
        "retention": 0.5,
    }
    assert r.json()["settings"] == want
    assert (await client.get("/queues/cfg")).json()["settings"] == want
    rec = await db.fetchrow("SELECT * FROM jobq.queues WHERE name = 'cfg'")
    assert {k: rec[k] for k in want if k in rec} == {k: v for k, v in want.items() if k in rec}
    # the queue now exists, with no jobs
    row = await queue_row(client, "cfg")
    assert (row["pending"], row["scheduled"], row["running"], row["dead"], row["completed"]) == (
        0,
        0,
        0,
        0,
        0,
    )
    # a lease uses the queue's visibility_timeout
    await enqueue(client, "cfg")
    (leased,) = await lease(client, "cfg")
    expires = datetime.fromisoformat(leased["lease_expires_at"].replace("Z", "+00:00"))
    assert timedelta(seconds=5) < expires - datetime.now(UTC) < timedelta(seconds=12)


@pytest.mark.parametrize(
    "body",
    [
        {"visibility_timeout": 0},
        {"visibility_timeout": -1},
        {"visibility_timeout": 43201},
        {"visibility_timeout": "long"},
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": "x"},
        {"backoff_base": -1},
        {"backoff_cap": -1},
        {"retention": -1},
        {"unknown": 1},
        [],
        "x",
    ],
)
async def test_patch_queue_rejects_invalid(client, db, body):
    assert_problem(await client.patch("/queues/cfg", json=body), 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0
    assert_problem(await client.get("/queues/cfg"), 404, "not_found")


async def test_patch_invalid_leaves_existing_settings(client):
    assert (await client.patch("/queues/cfg", json={"max_attempts": 7})).status_code == 200
    assert_problem(
        await client.patch("/queues/cfg", json={"max_attempts": 7, "retention": -5}), 422, "validation_error"
    )
    assert (await client.get("/queues/cfg")).json()["settings"] == DEFAULTS | {"max_attempts": 7}
    assert_problem(
        await client.patch("/queues/bad%20name", json={"max_attempts": 2}), 422, "validation_error"
    )


async def test_patched_max_attempts_applies_to_jobs_without_their_own(client, db):
    assert (await client.patch("/queues/m", json={"max_attempts": 2})).status_code == 200
    job = await enqueue(client, "m")
    assert job["max_attempts"] == 2
    own = await enqueue(client, "m", max_attempts=4, delay=3600)
    assert own["max_attempts"] == 4
    statuses = []
    for _ in range(2):
        leased = await lease_one(client, "m", job["id"])
        r = await client.post(
            "/nack", json={"id": job["id"], "lease_token": leased["lease_token"], "retry_after": 0}
        )
        assert r.status_code == 200, r.text
        statuses.append(r.json()["status"])
    assert statuses == ["pending", "dead"]
    rec = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs WHERE id = $1", job["id"])
    assert (rec["status"], rec["attempts"]) == ("dead", 2)
    assert (await client.get(f"/jobs/{own['id']}")).json()["max_attempts"] == 4


async def test_pause_and_resume(client, db):
    job = await enqueue(client, "pq")
    r = await client.post("/queues/pq/pause")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is True and r.json()["queue"] == "pq" and r.json()["pending"] == 1
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'pq'") is True
    assert await lease(client, "pq", max_jobs=10) == []
    assert await lease(client, "pq", wait=0.5) == []
    second = await enqueue(client, "pq")  # enqueue still works
    assert await lease(client, "pq", max_jobs=10) == []
    row = await queue_row(client, "pq")
    assert row["paused"] is True and row["pending"] == 2 and row["running"] == 0
    assert (await client.get("/queues/pq")).json()["paused"] is True
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'pending'") == 2

    r = await client.post("/queues/pq/resume")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is False
    got = await lease(client, "pq", max_jobs=10)
    assert sorted(j["id"] for j in got) == sorted([job["id"], second["id"]])


async def test_pause_bad_queue_name(client):
    assert_problem(await client.post("/queues/bad%20name/pause"), 422, "validation_error")


# --- health ----------------------------------------------------------------------------------------


async def test_healthz(client):
    r = await client.get("/healthz")
    assert r.status_code == 200, r.text


async def test_readyz(client):
    r = await client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["ready"] is True


# --- retention -------------------------------------------------------------------------------------


async def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_retention_prunes_completed_and_cancelled(start_service, db):
    service = start_service(prune_interval=0.2)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.patch("/queues/r", json={"retention": 0})
        assert r.status_code == 200, r.text
        done = [(await complete(client, "r"))["id"] for _ in range(3)]
        dead = await make_dead(client, "r")
        cancelled = await enqueue(client, "r", delay=3600)
        assert (await client.delete(f"/jobs/{cancelled['id']}")).status_code == 200
        pending = (await enqueue(client, "r", delay=3600))["id"]
        kept = (await complete(client, "keep"))["id"]  # default retention: 24 h

        async def pruned() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM jobq.all_jobs WHERE id = ANY($1::bigint[])", done + [cancelled["id"]]
            )
            return n == 0

        await wait_for(pruned, what="completed and cancelled jobs to be pruned")
        assert await status_of(db, dead) == "dead"
        assert await status_of(db, pending) == "pending"
        assert await status_of(db, kept) == "completed"
        row = await queue_row(client, "r")
        assert (row["completed"], row["dead"], row["scheduled"]) == (0, 1, 1)
        for job_id in done:
            assert_problem(await client.get(f"/jobs/{job_id}"), 404, "not_found")


async def test_retention_small_keeps_recent_jobs(start_service, db):
    service = start_service(prune_interval=0.2)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        assert (await client.patch("/queues/r", json={"retention": 1.5})).status_code == 200
        job = (await complete(client, "r"))["id"]
        completed_at = await db.fetchval("SELECT completed_at FROM jobq.all_jobs WHERE id = $1", job)
        await asyncio.sleep(0.6)  # several prune passes, all within retention
        assert await status_of(db, job) == "completed"

        async def gone() -> bool:
            return await status_of(db, job) is None

        await wait_for(gone, what="the job to be pruned after retention")
        age = await db.fetchval("SELECT extract(epoch FROM now() - $1::timestamptz)::float8", completed_at)
        assert age >= 1.5


async def test_run_now(client, db):
    """POST /jobs/{id}/run: a pending job not due yet becomes ready now; anything else is refused."""
    later = await enqueue(client, "q", "x", delay=3600)
    r = await client.post(f"/jobs/{later['id']}/run")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending" and r.json()["id"] == later["id"]
    assert await db.fetchval("SELECT run_at <= now() FROM jobq.all_jobs WHERE id = $1", later["id"]) is True
    # Due now: a second call would only move it back in line, so it is refused and nothing changes.
    run_at = await db.fetchval("SELECT run_at FROM jobq.all_jobs WHERE id = $1", later["id"])
    assert_problem(await client.post(f"/jobs/{later['id']}/run"), 409, "conflict")
    assert await db.fetchval("SELECT run_at FROM jobq.all_jobs WHERE id = $1", later["id"]) == run_at
    leased = await lease_one(client, "q", later["id"])
    refused = await client.post(f"/jobs/{leased['id']}/run")
    assert_problem(refused, 409, "conflict")
    assert "running" in refused.json()["detail"]
    assert_problem(await client.post("/jobs/999999/run"), 404, "not_found")
