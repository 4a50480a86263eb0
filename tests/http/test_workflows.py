"""Workflows over HTTP (API part 6): made all or nothing, read with a status worked out from their jobs,
waited for, listed, cancelled and resumed where they failed; refusals named in words."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.helpers import assert_problem, lease, lease_one

pytestmark = pytest.mark.anyio

ORDER = {
    "name": "order-7",
    "jobs": [
        {"ref": "charge", "queue": "payments", "kind": "charge", "payload": {"order": 7}, "max_attempts": 1},
        {"ref": "render", "queue": "pdf", "payload": {"order": 7}},
        {"ref": "send", "queue": "emails", "payload": {"order": 7}, "depends_on": ["charge", "render"]},
    ],
}


async def make(client, body=ORDER, **headers) -> dict:
    r = await client.post("/workflows", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


async def finish(client, queue: str, result=None) -> dict:
    job = await lease_one(client, queue)
    r = await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"], "result": result})
    assert r.is_success, r.text
    return job


async def fail(client, queue: str) -> dict:
    job = await lease_one(client, queue)
    r = await client.post(
        "/nack", json={"id": job["id"], "lease_token": job["lease_token"], "error": "declined"}
    )
    assert r.is_success, r.text
    return job


async def get(client, workflow_id: int, **params) -> dict:
    r = await client.get(f"/workflows/{workflow_id}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_workflow_runs_each_job_after_its_parents(client):
    made = await make(client)
    assert (made["name"], made["status"]) == ("order-7", "running")
    assert [(j["ref"], j["status"]) for j in made["jobs"]] == [
        ("charge", "pending"),
        ("render", "pending"),
        ("send", "waiting"),
    ]
    ids = {j["ref"]: j["id"] for j in made["jobs"]}
    assert ids["charge"] < ids["render"] < ids["send"]
    view = await get(client, made["id"])
    assert view["jobs"][2] == {
        "ref": "send",
        "id": ids["send"],
        "queue": "emails",
        "kind": None,
        "status": "waiting",
        "depends_on": ["charge", "render"],
    }
    assert (await client.get(f"/jobs/{ids['send']}")).json()["workflow_id"] == made["id"]
    await finish(client, "payments", {"charge": "ch_1"})
    assert (await get(client, made["id"]))["counts"] == {"completed": 1, "pending": 1, "waiting": 1}
    await finish(client, "pdf", {"pdf": "s3://7.pdf"})
    send = await lease_one(client, "emails", ids["send"])
    assert [p["result"] for p in send["parents"]] == [{"charge": "ch_1"}, {"pdf": "s3://7.pdf"}]
    await client.post("/ack", json={"id": send["id"], "lease_token": send["lease_token"]})
    done = await get(client, made["id"])
    assert (done["status"], done["counts"]) == ("completed", {"completed": 3})
    assert done["finished_at"] is not None


async def test_a_failed_job_fails_the_workflow_which_resumes_where_it_failed(client):
    made = await make(client)
    ids = {j["ref"]: j["id"] for j in made["jobs"]}
    await fail(client, "payments")
    await finish(client, "pdf")
    failed = await get(client, made["id"])
    assert failed["status"] == "failed"
    assert failed["counts"] == {"dead": 1, "completed": 1, "cancelled": 1}
    # Resumed: the dead job runs again, the job its death cancelled waits again.
    r = await client.post(f"/workflows/{made['id']}/retry")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running"
    assert {j["ref"]: j["status"] for j in r.json()["jobs"]} == {
        "charge": "pending",
        "render": "completed",
        "send": "waiting",
    }
    await finish(client, "payments")
    await finish(client, "emails")
    assert (await get(client, made["id"]))["status"] == "completed"
    assert (await client.get(f"/jobs/{ids['charge']}")).json()["attempts"] == 1


async def test_only_a_failed_workflow_is_retried(client):
    made = await make(client)
    assert_problem(await client.post(f"/workflows/{made['id']}/retry"), 409, "conflict")
    assert_problem(await client.post("/workflows/987654321/retry"), 404, "not_found")


async def test_cancelling_a_workflow_lets_running_jobs_finish_and_cancels_the_rest(client):
    made = await make(client)
    running = await lease_one(client, "payments")
    r = await client.delete(f"/workflows/{made['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert {j["ref"]: j["status"] for j in r.json()["jobs"]} == {
        "charge": "running",
        "render": "cancelled",
        "send": "cancelled",
    }
    r = await client.post("/ack", json={"id": running["id"], "lease_token": running["lease_token"]})
    assert r.is_success
    assert (await get(client, made["id"]))["status"] == "cancelled"
    assert await lease(client, "emails") == []
    assert_problem(await client.delete(f"/workflows/{made['id']}"), 409, "conflict")


async def test_a_finished_workflow_is_not_cancelled(client):
    """DELETE of a workflow that finished is 409, as for a finished job: its status stays what its jobs
    made it, and a failed one can still be retried."""
    made = await make(client, {"jobs": [{"ref": "only", "queue": "q", "payload": 1}]})
    await finish(client, "q")
    r = await client.delete(f"/workflows/{made['id']}")
    assert_problem(r, 409, "conflict")
    assert "is completed" in r.json()["detail"]
    assert (await get(client, made["id"]))["status"] == "completed"


async def test_a_wait_on_another_replica_answers_when_the_last_job_ends(start_service):
    quiet = {"wakeup_safety_interval": 60.0}
    a, b = start_service(**quiet), start_service(**quiet)
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, timeout=30) as on_b,
    ):
        made = await make(on_b, {"jobs": [{"ref": "only", "queue": "q", "payload": 1}]})
        waited = asyncio.ensure_future(on_a.get(f"/workflows/{made['id']}", params={"wait": 20}))
        await asyncio.sleep(0.5)
        assert not waited.done()
        ended = time.monotonic()
        await finish(on_b, "q")
        answer = (await waited).json()
        assert answer["status"] == "completed"
        assert time.monotonic() - ended < 1.0


async def test_parents_outside_the_workflow_are_named_by_id(client):
    outside = (await client.post("/jobs", json={"queue": "q", "payload": 0})).json()
    made = await make(
        client, {"jobs": [{"ref": "after", "queue": "c", "payload": 1, "depends_on": [outside["id"]]}]}
    )
    assert made["jobs"][0]["status"] == "waiting"
    assert (await get(client, made["id"]))["jobs"][0]["depends_on"] == [outside["id"]]
    await finish(client, "q")
    assert (await get(client, made["id"]))["jobs"][0]["status"] == "pending"


@pytest.mark.parametrize(
    ("jobs", "words"),
    [
        (
            [{"ref": "a", "queue": "q", "payload": 1}, {"ref": "a", "queue": "q", "payload": 2}],
            "jobs[1].ref 'a' is used twice (also jobs[0])",
        ),
        (
            [{"ref": "a", "queue": "q", "payload": 1, "depends_on": ["b", "c"]}],
            "refs that are no job of the workflow: 'b', 'c'",
        ),
        (
            [
                {"ref": "a", "queue": "q", "payload": 1, "depends_on": ["c"]},
                {"ref": "b", "queue": "q", "payload": 1, "depends_on": ["a"]},
                {"ref": "c", "queue": "q", "payload": 1, "depends_on": ["b"]},
            ],
            "depends_on makes a cycle: 'a' -> 'c' -> 'b' -> 'a'",
        ),
        (
            [{"ref": "a", "queue": "q", "payload": 1, "depends_on": ["a"]}],
            "depends_on makes a cycle: 'a' -> 'a'",
        ),
        ([{"ref": "a", "queue": "q", "payload": 1, "depends_on": [987654321]}], "do not exist: 987654321"),
        ([{"ref": "a", "queue": "q", "payload": 1, "run_if": "failed"}], "run_if goes with depends_on"),
    ],
)
async def test_a_bad_graph_is_refused_naming_what_is_wrong_and_nothing_is_made(client, db, jobs, words):
    r = await client.post("/workflows", json={"jobs": jobs})
    assert r.status_code == 422, r.text
    assert words in r.text
    assert await db.fetchval("SELECT count(*) FROM jobq.workflows") == 0
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 0


async def test_an_idempotency_key_makes_the_workflow_once(client, db):
    first = await client.post("/workflows", json=ORDER, headers={"Idempotency-Key": "order-7"})
    again = await client.post("/workflows", json=ORDER, headers={"Idempotency-Key": "order-7"})
    assert first.status_code == again.status_code == 201
    assert first.content == again.content
    assert await db.fetchval("SELECT count(*) FROM jobq.workflows") == 1
    other = {**ORDER, "name": "order-8"}
    assert_problem(
        await client.post("/workflows", json=other, headers={"Idempotency-Key": "order-7"}), 409, "conflict"
    )


async def test_workflows_are_listed_newest_first_by_status_and_name(client):
    one = await make(client, {"name": "a", "jobs": [{"ref": "x", "queue": "q", "payload": 1}]})
    two = await make(client, {"name": "b", "jobs": [{"ref": "x", "queue": "r", "payload": 1}]})
    await finish(client, "q")
    await get(client, one["id"])  # a reader brings its kept status up to date
    page = (await client.get("/workflows", params={"limit": 1})).json()
    assert [w["id"] for w in page["workflows"]] == [two["id"]]
    rest = (await client.get("/workflows", params={"before_id": page["next_before_id"]})).json()
    assert [w["id"] for w in rest["workflows"]] == [one["id"]] and rest["next_before_id"] is None
    completed = (await client.get("/workflows", params={"status": "completed"})).json()["workflows"]
    assert [w["id"] for w in completed] == [one["id"]]
    named = (await client.get("/workflows", params={"name": "b"})).json()["workflows"]
    assert [(w["id"], w["status"]) for w in named] == [(two["id"], "running")]
