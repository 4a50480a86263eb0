"""Dependencies over HTTP (API part 6): `depends_on` and `run_if` on POST /jobs and /jobs/batch, the
`waiting` status in views, lists and queue rows, refusals in words, and a child woken on another
replica the moment its last parent is acked. The rules themselves: tests/service/test_dependencies.py."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.helpers import assert_problem, enqueue, lease, lease_one

pytestmark = pytest.mark.anyio


async def test_a_child_waits_is_shown_waiting_and_runs_after_its_parent(client):
    parent = await enqueue(client)
    child = await enqueue(client, "c", {"n": 1}, depends_on=[parent["id"]])
    assert (child["status"], child["depends_on"], child["run_if"], child["workflow_id"]) == (
        "waiting",
        [parent["id"]],
        "completed",
        None,
    )
    assert (await client.get(f"/jobs/{child['id']}")).json()["status"] == "waiting"
    listed = (await client.get("/jobs", params={"status": "waiting"})).json()["jobs"]
    assert [j["id"] for j in listed] == [child["id"]]
    (row,) = [r for r in (await client.get("/queues")).json() if r["queue"] == "c"]
    assert (row["waiting"], row["pending"]) == (1, 0)
    assert await lease(client, "c") == []
    leased = await lease_one(client, "q", parent["id"])
    assert (
        await client.post("/ack", json={"id": leased["id"], "lease_token": leased["lease_token"]})
    ).is_success
    assert (await lease_one(client, "c", child["id"]))["payload"] == {"n": 1}


async def test_a_batch_mixes_jobs_with_and_without_parents(client):
    parent = await enqueue(client)
    r = await client.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"queue": "c", "payload": 1},
                {"queue": "c", "payload": 2, "depends_on": [parent["id"]], "run_if": "failed"},
            ]
        },
    )
    assert r.status_code == 201, r.text
    jobs = r.json()["jobs"]
    assert [(j["payload"], j["status"], j["run_if"]) for j in jobs] == [
        (1, "pending", None),
        (2, "waiting", "failed"),
    ]
    assert jobs[0]["id"] < jobs[1]["id"]


async def test_unknown_parents_are_a_422_that_names_them(client, db):
    parent = await enqueue(client)
    r = await client.post("/jobs", json={"queue": "c", "payload": 1, "depends_on": [parent["id"], 987654321]})
    problem = assert_problem(r, 422, "validation_error")
    assert "depends_on names jobs that do not exist: 987654321" in problem["detail"]
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE queue = 'c'") == 0


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"depends_on": []}, "depends_on"),
        ({"depends_on": list(range(1, 1002))}, "depends_on"),
        ({"depends_on": [0]}, "depends_on"),
        ({"run_if": "completed"}, "run_if goes with depends_on"),
        ({"depends_on": [1], "run_if": "sometimes"}, "run_if"),
        ({"depends_on": [1], "dedup_key": "d"}, "takes no dedup_key"),
    ],
)
async def test_bad_dependencies_are_refused_in_words(client, fields, words):
    r = await client.post("/jobs", json={"queue": "c", "payload": 1, **fields})
    assert r.status_code == 422, r.text
    assert words in r.text


async def test_an_idempotency_key_makes_a_child_once_and_answers_its_repeat_alike(client, db):
    """A child's answer depends on its parents' state (waiting, or decided at once), so it is kept whole
    under the key: the repeat answers the same bytes, even after the parent ended, and makes nothing."""
    parent = await enqueue(client)
    body = {"queue": "c", "payload": {"n": 1}, "depends_on": [parent["id"]]}
    first = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201, first.text
    assert first.json()["status"] == "waiting"
    leased = await lease_one(client, "q", parent["id"])
    assert (
        await client.post("/ack", json={"id": leased["id"], "lease_token": leased["lease_token"]})
    ).is_success
    again = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert (again.status_code, again.content) == (201, first.content)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE queue = 'c'") == 1
    other = {**body, "run_if": "finished"}
    assert_problem(await client.post("/jobs", json=other, headers={"Idempotency-Key": "k1"}), 409, "conflict")
    plain = {"queue": "c", "payload": {"n": 1}}
    assert_problem(await client.post("/jobs", json=plain, headers={"Idempotency-Key": "k1"}), 409, "conflict")
    batch = {"jobs": [body, {"queue": "c", "payload": 2}]}
    made = await client.post("/jobs/batch", json=batch, headers={"Idempotency-Key": "k2"})
    assert made.status_code == 201, made.text
    repeat = await client.post("/jobs/batch", json=batch, headers={"Idempotency-Key": "k2"})
    assert (repeat.status_code, repeat.content) == (201, made.content)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE queue = 'c'") == 3


async def test_a_key_sent_twice_at_once_with_parents_makes_one_child(client, db):
    parent = await enqueue(client)
    body = {"queue": "c", "payload": 1, "depends_on": [parent["id"]]}
    answers = await asyncio.gather(
        *(client.post("/jobs", json=body, headers={"Idempotency-Key": "k"}) for _ in range(8))
    )
    assert {(r.status_code, r.content) for r in answers} == {(201, answers[0].content)}
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE queue = 'c'") == 1


async def test_cancelling_a_waiting_job(client):
    parent = await enqueue(client)
    child = await enqueue(client, "c", 1, depends_on=[parent["id"]])
    r = await client.delete(f"/jobs/{child['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"


async def test_a_long_poll_on_another_replica_wakes_for_a_decided_child(start_service):
    """The child's queue is long-polled on one replica while its parent is acked on the other: the
    decision's NOTIFY wakes the poll (with the safety poll a minute away, nothing else could)."""
    quiet = {"wakeup_safety_interval": 60.0}
    a, b = start_service(**quiet), start_service(**quiet)
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, timeout=30) as on_b,
    ):
        parent = await enqueue(on_b)
        child = await enqueue(on_b, "c", 1, depends_on=[parent["id"]])
        leased = await lease_one(on_b, "q", parent["id"])
        poll = asyncio.ensure_future(on_a.post("/lease", json={"queue": "c", "wait": 20}))
        await asyncio.sleep(0.5)  # the poll is waiting
        assert not poll.done()
        acked = time.monotonic()
        r = await on_b.post("/ack", json={"id": leased["id"], "lease_token": leased["lease_token"]})
        assert r.is_success
        jobs = (await poll).json()["jobs"]
        assert [j["id"] for j in jobs] == [child["id"]]
        assert time.monotonic() - acked < 1.0


async def ack_with(client, job: dict, result) -> None:
    r = await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"], "result": result})
    assert r.is_success, r.text


async def test_a_lease_carries_its_parents_results(client):
    first, second = await enqueue(client, kind="charge"), await enqueue(client, kind="render")
    child = await enqueue(client, "c", 1, depends_on=[second["id"], first["id"]])
    plain = await enqueue(client, "c", 2)
    for job in await lease(client, max_jobs=2):
        await ack_with(client, job, {"from": job["id"]})
    leased = {j["id"]: j for j in await lease(client, "c", max_jobs=2)}
    # In id order, as GET /jobs/{id}/parents pages them, whatever the order of depends_on.
    assert leased[child["id"]]["parents"] == [
        {"id": first["id"], "kind": "charge", "status": "completed", "result": {"from": first["id"]}},
        {"id": second["id"], "kind": "render", "status": "completed", "result": {"from": second["id"]}},
    ]
    # A job without parents is handed out as it always was.
    assert "parents" not in leased[plain["id"]] and "depends_on" not in leased[plain["id"]]


async def test_a_lease_of_a_child_with_more_than_a_hundred_parents_carries_none(client):
    parents = [
        j["id"]
        for j in (
            await client.post(
                "/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(101)]}
            )
        ).json()["jobs"]
    ]
    child = await enqueue(client, "c", 1, depends_on=parents)
    for job in await lease(client, max_jobs=101):
        await ack_with(client, job, None)
    leased = await lease_one(client, "c", child["id"])
    assert "parents" not in leased
    # They are paged instead, in id order.
    page = (await client.get(f"/jobs/{child['id']}/parents", params={"limit": 60})).json()
    assert [p["id"] for p in page["parents"]] == sorted(parents)[:60]
    assert page["next_after_id"] == sorted(parents)[59]
    rest = (
        await client.get(f"/jobs/{child['id']}/parents", params={"after_id": page["next_after_id"]})
    ).json()
    assert [p["id"] for p in rest["parents"]] == sorted(parents)[60:]
    assert rest["next_after_id"] is None
    assert {p["status"] for p in rest["parents"]} == {"completed"}


async def test_the_parents_page_of_a_job_without_parents_and_of_no_job(client):
    job = await enqueue(client)
    assert (await client.get(f"/jobs/{job['id']}/parents")).json() == {"parents": [], "next_after_id": None}
    assert_problem(await client.get("/jobs/987654321/parents"), 404, "not_found")
