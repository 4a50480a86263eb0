"""Results and progress: what an ack (`result`) and an extend (`progress`) keep with a job, shown on every
job view; JOBQ_MAX_RESULT_BYTES bounds both, and a refused one changes nothing.

States are checked in the database (jobq.jobs).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from app import service
from app.core.tokens import token_text
from tests.helpers import assert_problem, enqueue, lease, lease_one, open_database, row
from tests.waiting import until

pytestmark = pytest.mark.anyio

LIMIT = 100  # JOBQ_MAX_RESULT_BYTES of the services started here


@pytest.fixture
async def http(start_service) -> httpx.AsyncClient:
    service = start_service(max_result_bytes=LIMIT)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        yield http


def held(job: dict, **fields: object) -> dict:
    """An ack or extend body for a leased job."""
    return {"id": job["id"], "lease_token": job["lease_token"], **fields}


async def stored(db, job_id: int) -> tuple[str, object, object]:
    """The job's status, result and progress as the database holds them (decoded)."""
    rec = await row(db, job_id)
    decode = lambda text: None if text is None else json.loads(text)  # noqa: E731
    return rec["status"], decode(rec["result"]), decode(rec["progress"])


def text_of(size: int) -> str:
    """A JSON string whose encoding is `size` bytes (its two quotes included)."""
    return "x" * (size - 2)


# --- ack with a result -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [{"rows": 3, "files": ["a.csv"]}, "done", 42, 0.5, False, [], {}, 2**70, "ünïcode ✓"],
)
async def test_ack_keeps_its_result_and_get_shows_it(client, db, result):
    job = await enqueue(client)
    assert job["result"] is None and job["progress"] is None  # every job view has both
    got = await lease_one(client)
    r = await client.post("/ack", json=held(got, result=result))
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    assert await stored(db, job["id"]) == ("completed", result, None)
    shown = (await client.get(f"/jobs/{job['id']}")).json()
    assert (shown["status"], shown["result"], shown["progress"]) == ("completed", result, None)


async def test_ack_without_a_result_or_with_null_keeps_none(client, db):
    a, b = await enqueue(client), await enqueue(client)
    la, lb = await lease(client, max_jobs=2)
    assert (await client.post("/ack", json=held(la))).status_code == 200
    assert (await client.post("/ack", json=held(lb, result=None))).status_code == 200
    for job in (a, b):
        assert await stored(db, job["id"]) == ("completed", None, None)
        assert (await client.get(f"/jobs/{job['id']}")).json()["result"] is None


async def test_a_repeated_ack_keeps_the_first_result(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    assert (await client.post("/ack", json=held(got, result="first"))).status_code == 200
    r = await client.post("/ack", json=held(got, result="second"))
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert await stored(db, job["id"]) == ("completed", "first", None)


async def test_a_late_ack_after_expiry_keeps_its_result(client, db):
    """The last holder may ack after its lease expired (the work was done): its result is kept too."""
    job = await enqueue(client)
    got = await lease_one(client)
    await db.execute(
        "UPDATE jobq.jobs SET status = 'pending', lease_expires_at = NULL WHERE id = $1", job["id"]
    )
    assert (await client.post("/ack", json=held(got, result={"late": True}))).status_code == 200
    assert await stored(db, job["id"]) == ("completed", {"late": True}, None)


async def test_concurrent_acks_sharing_a_statement_keep_each_its_own_result(client, db):
    ids = [(await enqueue(client, payload=n))["id"] for n in range(40)]
    leased = await lease(client, max_jobs=40)
    # Half with a result, half without, all at once: they share ACK statements (app/service/coalesce.py).
    answers = await asyncio.gather(
        *(
            client.post("/ack", json=held(j, result={"n": j["payload"]} if j["payload"] % 2 else None))
            for j in leased
        )
    )
    assert [a.status_code for a in answers] == [200] * 40
    for n, job_id in enumerate(ids):
        assert await stored(db, job_id) == ("completed", {"n": n} if n % 2 else None, None)


# --- the limit -------------------------------------------------------------------------------------


async def test_the_limit_is_inclusive(http, db):
    job = await enqueue(http)
    got = await lease_one(http)
    r = await http.post("/ack", json=held(got, result=text_of(LIMIT)))
    assert r.status_code == 200, r.text
    assert await stored(db, job["id"]) == ("completed", text_of(LIMIT), None)


async def test_a_result_over_the_limit_is_413_and_the_job_stays_running(http, db):
    job = await enqueue(http)
    got = await lease_one(http)
    before = dict(await row(db, job["id"]))
    body = assert_problem(
        await http.post("/ack", json=held(got, result=text_of(LIMIT + 1))), 413, "payload_too_large"
    )
    assert f"{LIMIT + 1} bytes" in body["detail"] and f"limit is {LIMIT} bytes" in body["detail"]
    assert "ack again without the result or with a smaller one" in body["detail"]
    assert dict(await row(db, job["id"])) == before  # nothing changed: still running, under its lease
    assert (before["status"], token_text(before["lease_token"], before["queue"])) == (
        "running",
        got["lease_token"],
    )
    # The worker acks again without the result: done.
    r = await http.post("/ack", json=held(got))
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert await stored(db, job["id"]) == ("completed", None, None)


async def test_text_jsonb_cannot_hold_is_422_and_changes_nothing(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    before = dict(await row(db, job["id"]))
    nul = await client.post("/ack", json=held(got, result={"text": "a\u0000b"}))
    assert "NUL" in assert_problem(nul, 422, "validation_error")["detail"]
    surrogate = json.dumps(held(got)).replace("}", ', "result": "\\udce9"}').encode()
    lone = await client.post("/ack", content=surrogate, headers={"content-type": "application/json"})
    assert_problem(lone, 422, "validation_error")
    assert dict(await row(db, job["id"])) == before
    # An escaped backslash before "u0000" is just text.
    text = "\\u0000"
    assert (await client.post("/ack", json=held(got, result=text))).status_code == 200
    assert await stored(db, job["id"]) == ("completed", text, None)


# --- ack/batch -------------------------------------------------------------------------------------


async def test_ack_batch_keeps_each_items_result_and_refuses_items_on_their_own(http, db):
    """Each item is answered on its own, as lease_lost items are: a result over the limit (or that
    PostgreSQL cannot store) fails its item, which stays running; the others complete."""
    ids = [(await enqueue(http))["id"] for _ in range(5)]
    la, lb, lc, ld, le = await lease(http, max_jobs=5)
    items = [
        held(la, result={"ok": 1}),
        held(lb),
        held(lc, result=text_of(LIMIT + 1)),
        {"id": ld["id"], "lease_token": str(uuid.uuid4()), "result": 4},
        held(le, result="a\u0000b"),
    ]
    r = await http.post("/ack/batch", json={"items": items})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [
        {"id": ids[0], "ok": True},
        {"id": ids[1], "ok": True},
        {"id": ids[2], "ok": False, "code": "payload_too_large"},
        {"id": ids[3], "ok": False, "code": "lease_lost"},
        {"id": ids[4], "ok": False, "code": "validation_error"},
    ]
    assert [await stored(db, i) for i in ids] == [
        ("completed", {"ok": 1}, None),
        ("completed", None, None),
        ("running", None, None),
        ("running", None, None),
        ("running", None, None),
    ]
    # The refused one acks again without its result.
    r = await http.post("/ack/batch", json={"items": [held(lc)]})
    assert r.json()["results"] == [{"id": ids[2], "ok": True}]
    assert await stored(db, ids[2]) == ("completed", None, None)


async def test_ack_batch_of_only_refused_results_sends_nothing(http, db):
    job = await enqueue(http)
    got = await lease_one(http)
    r = await http.post("/ack/batch", json={"items": [held(got, result=text_of(LIMIT + 1))]})
    assert r.json()["results"] == [{"id": job["id"], "ok": False, "code": "payload_too_large"}]
    assert (await row(db, job["id"]))["status"] == "running"


async def test_release_takes_no_result(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    r = await client.post("/release", json={"items": [held(got, result=1)]})
    assert_problem(r, 422, "validation_error")
    assert (await row(db, job["id"]))["status"] == "running"


# --- progress --------------------------------------------------------------------------------------


async def test_extend_with_progress_at_the_same_visibility_timeout(client, db):
    """A worker reports progress by extending with its lease's visibility_timeout again; the lease goes
    on, and the job shows the latest progress, kept (not cleared) by an extend without one and by the ack."""
    job = await enqueue(client)
    got = await lease_one(client, visibility_timeout=30)
    for progress in ({"done": 10, "of": 100}, 0.5):
        r = await client.post("/extend", json=held(got, visibility_timeout=30, progress=progress))
        assert r.status_code == 200, r.text
        assert await stored(db, job["id"]) == ("running", None, progress)
        shown = (await client.get(f"/jobs/{job['id']}")).json()
        assert (shown["status"], shown["progress"], shown["result"]) == ("running", progress, None)
    assert (await client.post("/extend", json=held(got, visibility_timeout=30))).status_code == 200
    assert (
        await client.post("/extend", json=held(got, visibility_timeout=30, progress=None))
    ).status_code == 200
    assert await stored(db, job["id"]) == ("running", None, 0.5)
    assert (await client.post("/ack", json=held(got, result="done"))).status_code == 200
    assert await stored(db, job["id"]) == ("completed", "done", 0.5)


async def test_progress_over_the_limit_is_413_and_changes_nothing(http, db):
    job = await enqueue(http)
    got = await lease_one(http, visibility_timeout=30)
    assert (
        await http.post("/extend", json=held(got, visibility_timeout=30, progress="x"))
    ).status_code == 200
    before = dict(await row(db, job["id"]))
    r = await http.post("/extend", json=held(got, visibility_timeout=600, progress=text_of(LIMIT + 1)))
    body = assert_problem(r, 413, "payload_too_large")
    assert "extend again without progress or with a smaller one" in body["detail"]
    assert dict(await row(db, job["id"])) == before  # the deadline and the progress as they were
    r = await http.post("/extend", json=held(got, visibility_timeout=600, progress=text_of(LIMIT)))
    assert r.status_code == 200, r.text
    assert await stored(db, job["id"]) == ("running", None, text_of(LIMIT))


async def test_extend_with_progress_is_fenced(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    r = await client.post(
        "/extend", json=held(got, lease_token=str(uuid.uuid4()), visibility_timeout=30, progress=1)
    )
    assert_problem(r, 409, "lease_lost")
    assert await stored(db, job["id"]) == ("running", None, None)


# --- every job view, and retention ------------------------------------------------------------------


async def test_dead_list_and_cancel_show_result_and_progress(client, db):
    job = await enqueue(client, max_attempts=1)
    got = await lease_one(client)
    await client.post("/extend", json=held(got, visibility_timeout=30, progress={"step": 2}))
    await client.post("/nack", json=held(got, error="boom"))
    (dead,) = (await client.get("/dead")).json()["jobs"]
    assert (dead["id"], dead["result"], dead["progress"]) == (job["id"], None, {"step": 2})
    other = await enqueue(client, "other")
    cancelled = (await client.delete(f"/jobs/{other['id']}")).json()
    assert (cancelled["status"], cancelled["result"], cancelled["progress"]) == ("cancelled", None, None)


async def test_results_go_with_their_jobs_at_retention(client, db, database_url):
    job = await enqueue(client)
    got = await lease_one(client)
    await client.post("/ack", json=held(got, result={"big": "x" * 1000}))
    # Its purge_after passes: gone for the API at once, and its row with the next retention round.
    await db.execute(
        "UPDATE jobq.jobs_history SET purge_after = now() - interval '1 second' WHERE id = $1", job["id"]
    )
    assert (await client.get(f"/jobs/{job['id']}")).status_code == 404
    # The service runs retention rounds of its own (one as it starts, which can come after the update
    # above): the row goes with whichever round comes next, this test's or the service's.
    async with open_database(database_url) as database:

        async def pruned() -> bool:
            await service.keep_history(database)
            return await db.fetchval("SELECT count(*) FROM jobq.jobs_history WHERE id = $1", job["id"]) == 0

        await until(pruned, timeout=5)
