"""Workers: POST /lease, /ack, /ack/batch, /nack, /nack/batch, /extend, against the HTTP contract.

States are checked in the database (jobq.jobs); deadlines are compared with the database clock.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta

import pytest

from app.core.tokens import token_text
from tests.helpers import assert_problem, db_now, enqueue, lease, lease_one, row

pytestmark = pytest.mark.anyio

LEASE_FIELDS = {
    "id", "queue", "kind", "key", "payload", "priority", "attempts", "max_attempts", "run_at", "created_at",
    "last_error", "lease_token", "lease_expires_at", "traceparent", "tracestate",
}  # fmt: skip
MISSING_ID = 987_654_321


# --- helpers ---------------------------------------------------------------------------------------


def tok() -> str:
    """A well-formed lease token that is no job's."""
    return str(uuid.uuid4())


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def wait_for_status(db, job_id: int, status: str, timeout: float = 10.0):
    """Poll the job's row until it has `status` (leases expire every 0.2 s); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        rec = await row(db, job_id)
        if rec["status"] == status:
            return rec
        assert time.monotonic() < deadline, f"job {job_id} not {status} within {timeout} s: {dict(rec)}"
        await asyncio.sleep(0.05)


def results_of(r) -> list[dict]:
    """A batch answer reduced to the contract's fields: {id, ok} plus `code` when not ok.

    The contract allows added fields; an ok item must not carry an error code."""
    assert r.status_code == 200, r.text
    out = []
    for item in r.json()["results"]:
        if item["ok"] is True:
            assert item.get("code") is None, item
            out.append({"id": item["id"], "ok": True})
        else:
            out.append({"id": item["id"], "ok": item["ok"], "code": item["code"]})
    return out


# --- lease -----------------------------------------------------------------------------------------


async def test_lease_returns_all_fields_and_counts_the_attempt(client, db):
    job = await enqueue(client, "emails", {"to": "a@example.com"}, priority=3)
    t0 = await db_now(db)
    got = await lease_one(client, "emails", worker_id="w1")
    t1 = await db_now(db)
    assert got.keys() == LEASE_FIELDS  # the contract's fields, and no bookkeeping of the statement
    fields = ("id", "queue", "kind", "payload", "priority", "attempts", "max_attempts", "last_error")
    assert tuple(got[k] for k in fields) == (
        job["id"], "emails", None, {"to": "a@example.com"}, 3, 1, 5, None,
    )  # fmt: skip
    assert ts(got["run_at"]) == ts(job["run_at"])
    assert ts(got["created_at"]) == ts(job["created_at"])
    assert isinstance(got["lease_token"], str) and got["lease_token"]
    r = await row(db, job["id"])
    assert (r["status"], r["attempts"], token_text(r["lease_token"], r["queue"]), r["worker_id"]) == (
        "running", 1, got["lease_token"], "w1",
    )  # fmt: skip
    assert ts(got["lease_expires_at"]) == r["lease_expires_at"]
    # default visibility timeout: 30 s
    assert t0 + timedelta(seconds=30) <= r["lease_expires_at"] <= t1 + timedelta(seconds=30)


async def test_lease_shows_each_jobs_kind_and_key(client, db):
    kinds = ["resize", None, "email.send"]
    keys = [None, "customer-42", "ü" * 256]
    ids = [
        (await enqueue(client, "k", i, **({"kind": k} if k else {}), **({"key": key} if key else {})))["id"]
        for i, (k, key) in enumerate(zip(kinds, keys, strict=True))
    ]
    leased = await lease(client, "k", max_jobs=3)
    assert {j["id"]: (j["kind"], j["key"]) for j in leased} == dict(
        zip(ids, zip(kinds, keys, strict=True), strict=True)
    )
    assert all(j.keys() == LEASE_FIELDS for j in leased)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'running'") == 3


async def test_max_jobs_returns_up_to_n_in_priority_run_at_id_order(client, db):
    t = await db_now(db)
    early, late = (t - timedelta(seconds=60)).isoformat(), (t - timedelta(seconds=30)).isoformat()
    specs = [  # (priority, run_at)
        (5, early), (1, late), (1, early), (0, late), (1, early), (-2, late), (5, early),
    ]  # fmt: skip
    ids = [(await enqueue(client, priority=p, run_at=ra, payload=i))["id"] for i, (p, ra) in enumerate(specs)]
    expected = [ids[k] for k in sorted(range(len(specs)), key=lambda k: (specs[k][0], specs[k][1], ids[k]))]
    assert expected == [ids[5], ids[3], ids[2], ids[4], ids[1], ids[0], ids[6]]

    got = await lease(client, max_jobs=4)
    assert [j["id"] for j in got] == expected[:4]
    got = await lease(client, max_jobs=10)
    assert [j["id"] for j in got] == expected[4:]
    assert await lease(client, max_jobs=10) == []
    assert (
        await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'running' AND attempts = 1") == 7
    )


async def test_lower_priority_runs_first_one_at_a_time(client):
    ids = {p: (await enqueue(client, priority=p))["id"] for p in (10, -5, 0, 7, 2**31 - 1, -(2**31))}
    order = [(await lease_one(client))["id"] for _ in ids]
    assert order == [ids[p] for p in sorted(ids)]


async def test_delayed_job_is_not_leased_before_run_at(client, db):
    delayed = await enqueue(client, payload="later", delay=30)
    t = await db_now(db)
    future = await enqueue(client, payload="future", run_at=(t + timedelta(hours=1)).isoformat())
    assert await lease(client, max_jobs=10) == []
    ready = await enqueue(client, payload="now")
    got = await lease(client, max_jobs=10)
    assert [j["id"] for j in got] == [ready["id"]]
    for job in (delayed, future):
        r = await row(db, job["id"])
        assert (r["status"], r["attempts"], r["lease_token"]) == ("pending", 0, None)
    # once run_at has come, it is leasable
    short = await enqueue(client, payload="soon", delay=1)
    assert await lease(client) == []
    got = await lease(client, wait=5)
    assert [j["id"] for j in got] == [short["id"]]


async def test_lease_on_empty_and_unknown_queue(client, db):
    await enqueue(client, "other")
    r = await client.post("/lease", json={"queue": "nobody-ever-used-this"})
    assert r.status_code == 200 and r.json() == {"jobs": []}
    job = await enqueue(client, "q")
    await lease_one(client, "q")
    r = await client.post("/lease", json={"queue": "q", "max_jobs": 5})
    assert r.status_code == 200 and r.json() == {"jobs": []}
    assert (await row(db, job["id"]))["attempts"] == 1


async def test_visibility_timeout_sets_lease_expiry(client, db):
    job = await enqueue(client)
    t0 = await db_now(db)
    got = await lease_one(client, visibility_timeout=120.5)
    t1 = await db_now(db)
    expires = (await row(db, job["id"]))["lease_expires_at"]
    assert ts(got["lease_expires_at"]) == expires
    assert t0 + timedelta(seconds=120.5) <= expires <= t1 + timedelta(seconds=120.5)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_jobs": 0}, {"max_jobs": 1001}, {"visibility_timeout": 0}, {"visibility_timeout": 43200.5},
        {"visibility_timeout": 86400}, {"wait": 61}, {"wait": -1}, {"max_jobs": "many"},
    ],
)  # fmt: skip
async def test_lease_validation(client, db, fields):
    job = await enqueue(client)
    r = await client.post("/lease", json={"queue": "q", **fields})
    assert_problem(r, 422, "validation_error")
    assert (await row(db, job["id"]))["status"] == "pending"


async def test_lease_limits_are_inclusive(client):
    await enqueue(client)
    await enqueue(client)
    assert len(await lease(client, max_jobs=1000, visibility_timeout=43200)) == 2
    await enqueue(client)
    start = time.monotonic()
    assert len(await lease(client, max_jobs=1, wait=60, visibility_timeout=0.5)) == 1
    assert time.monotonic() - start < 5


async def test_wait_on_empty_queue_returns_empty_after_wait(client):
    start = time.monotonic()
    r = await client.post("/lease", json={"queue": "q", "wait": 1})
    elapsed = time.monotonic() - start
    assert r.status_code == 200 and r.json() == {"jobs": []}
    assert 0.9 <= elapsed < 3, elapsed


async def test_wait_returns_early_when_a_job_is_enqueued(client):
    async def later():
        await asyncio.sleep(0.5)
        return await enqueue(client, payload="wake")

    start = time.monotonic()
    leasing = asyncio.create_task(client.post("/lease", json={"queue": "q", "wait": 5}))
    job = await later()
    r = await leasing
    elapsed = time.monotonic() - start
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]
    assert 0.5 <= elapsed < 2.0, elapsed


# --- ack -------------------------------------------------------------------------------------------


async def test_ack_completes_and_is_idempotent(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    body = {"id": job["id"], "lease_token": got["lease_token"]}
    r = await client.post("/ack", json=body)
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    first = await row(db, job["id"])
    assert (first["status"], first["attempts"]) == ("completed", 1) and first["completed_at"] is not None
    r = await client.post("/ack", json=body)
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    assert dict(await row(db, job["id"])) == dict(first)
    r = await client.get(f"/jobs/{job['id']}")
    assert r.json()["status"] == "completed" and r.json()["completed_at"] is not None


@pytest.mark.parametrize("token", [tok(), "xyz"], ids=["another-lease", "not-a-token"])
async def test_ack_with_wrong_token_is_lease_lost(client, db, token):
    job = await enqueue(client)
    await lease_one(client)
    before = dict(await row(db, job["id"]))
    r = await client.post("/ack", json={"id": job["id"], "lease_token": token})
    assert_problem(r, 409, "lease_lost")
    assert dict(await row(db, job["id"])) == before
    assert before["status"] == "running"


async def test_a_token_names_its_queue_and_a_bare_uuid_as_issued_before_still_serves(client, db):
    # Tokens carry the job's queue (app/core/tokens.py); one with the right UUID and another queue is not the
    # lease. The bare UUID, as jobq issued tokens before, still extends, nacks and acks.
    job = await enqueue(client, "emails")
    got = await lease_one(client, "emails")
    bare, queue = got["lease_token"].split(".", 1)
    assert queue == "emails" and bare == str((await row(db, job["id"]))["lease_token"])
    before = dict(await row(db, job["id"]))
    for other in (f"{bare}.sms", f"{bare}.", f"{bare}.emails.x"):
        assert_problem(
            await client.post("/ack", json={"id": job["id"], "lease_token": other}), 409, "lease_lost"
        )
    assert dict(await row(db, job["id"])) == before
    r = await client.post("/extend", json={"id": job["id"], "lease_token": bare, "visibility_timeout": 60})
    assert r.status_code == 200, r.text
    r = await client.post("/nack", json={"id": job["id"], "lease_token": bare, "retry_after": 0})
    assert r.status_code == 200 and r.json()["status"] == "pending"
    again = await lease_one(client, "emails")
    bare = again["lease_token"].split(".", 1)[0]
    r = await client.post("/ack/batch", json={"items": [{"id": job["id"], "lease_token": bare}]})
    assert r.json() == {"results": [{"id": job["id"], "ok": True}]}
    assert (await row(db, job["id"]))["status"] == "completed"


async def test_ack_unknown_job_is_not_found_and_unleased_job_is_lease_lost(client, db):
    assert_problem(await client.post("/ack", json={"id": MISSING_ID, "lease_token": tok()}), 404, "not_found")
    job = await enqueue(client)
    r = await client.post("/ack", json={"id": job["id"], "lease_token": tok()})
    assert_problem(r, 409, "lease_lost")
    assert (await row(db, job["id"]))["status"] == "pending"


# --- nack ------------------------------------------------------------------------------------------


async def test_nack_with_retry_after(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    t0 = await db_now(db)
    body = {"id": job["id"], "lease_token": got["lease_token"], "error": "boom", "retry_after": 42}
    r = await client.post("/nack", json=body)
    t1 = await db_now(db)
    assert r.status_code == 200, r.text
    assert (r.json()["id"], r.json()["status"]) == (job["id"], "pending")
    rec = await row(db, job["id"])
    assert (rec["status"], rec["last_error"], rec["attempts"]) == ("pending", "boom", 1)
    assert ts(r.json()["run_at"]) == rec["run_at"]
    assert t0 + timedelta(seconds=42) <= rec["run_at"] <= t1 + timedelta(seconds=42)
    assert await lease(client) == []  # not before run_at


async def test_nack_without_retry_after_uses_capped_backoff(client, db):
    r = await client.patch("/queues/q", json={"backoff_base": 10, "backoff_cap": 15})
    assert r.status_code == 200, r.text
    a = await enqueue(client, payload="a")
    b = await enqueue(client, payload="b")

    # attempt 1: base * 2^0 = 10, jitter up to 30 %: 10..13
    got = await lease_one(client)
    assert (got["id"], got["attempts"]) == (a["id"], 1)
    t0 = await db_now(db)
    r = await client.post("/nack", json={"id": a["id"], "lease_token": got["lease_token"], "error": "e1"})
    t1 = await db_now(db)
    assert r.status_code == 200 and r.json()["status"] == "pending", r.text
    run_at = (await row(db, a["id"]))["run_at"]
    assert ts(r.json()["run_at"]) == run_at
    assert t0 + timedelta(seconds=10) <= run_at <= t1 + timedelta(seconds=13)

    # attempt 2: base * 2^1 = 20 (..26 with jitter), capped at 15
    got = await lease_one(client)
    assert got["id"] == b["id"]
    r = await client.post("/nack", json={"id": b["id"], "lease_token": got["lease_token"], "retry_after": 0})
    assert r.status_code == 200, r.text
    got = await lease_one(client)
    assert (got["id"], got["attempts"]) == (b["id"], 2)
    t0 = await db_now(db)
    r = await client.post("/nack", json={"id": b["id"], "lease_token": got["lease_token"]})
    t1 = await db_now(db)
    assert r.status_code == 200 and r.json()["status"] == "pending", r.text
    run_at = (await row(db, b["id"]))["run_at"]
    assert t0 + timedelta(seconds=15) <= run_at <= t1 + timedelta(seconds=15)


async def test_nack_dead_true_goes_dead(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    body = {"id": job["id"], "lease_token": got["lease_token"], "error": "fatal", "dead": True}
    r = await client.post("/nack", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "dead" and r.json()["id"] == job["id"]
    rec = await row(db, job["id"])
    assert (rec["status"], rec["last_error"], rec["attempts"]) == ("dead", "fatal", 1)
    assert await lease(client) == []


async def test_nack_on_last_attempt_goes_dead(client, db):
    job = await enqueue(client, max_attempts=2)
    for attempt in (1, 2):
        got = await lease_one(client)
        assert got["attempts"] == attempt and got["max_attempts"] == 2
        body = {"id": job["id"], "lease_token": got["lease_token"], "error": f"e{attempt}", "retry_after": 0}
        r = await client.post("/nack", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == ("pending" if attempt == 1 else "dead")
    rec = await row(db, job["id"])
    assert (rec["status"], rec["attempts"], rec["last_error"]) == ("dead", 2, "e2")
    r = await client.get("/dead", params={"queue": "q"})
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]


async def test_nack_then_ack_or_nack_with_same_token_is_lease_lost(client, db):
    job = await enqueue(client)
    got = await lease_one(client)
    body = {"id": job["id"], "lease_token": got["lease_token"]}
    r = await client.post("/nack", json={**body, "retry_after": 100})
    assert r.status_code == 200, r.text
    after_nack = dict(await row(db, job["id"]))
    assert_problem(await client.post("/ack", json=body), 409, "lease_lost")
    assert_problem(await client.post("/nack", json={**body, "retry_after": 0}), 409, "lease_lost")
    assert_problem(await client.post("/extend", json={**body, "visibility_timeout": 10}), 409, "lease_lost")
    assert dict(await row(db, job["id"])) == after_nack
    assert after_nack["status"] == "pending"


async def test_nack_unknown_job_or_wrong_token(client, db):
    r = await client.post("/nack", json={"id": MISSING_ID, "lease_token": tok()})
    assert_problem(r, 404, "not_found")
    job = await enqueue(client)
    await lease_one(client)
    before = dict(await row(db, job["id"]))
    for token in (tok(), "xyz"):
        r = await client.post("/nack", json={"id": job["id"], "lease_token": token})
        assert_problem(r, 409, "lease_lost")
    assert dict(await row(db, job["id"])) == before


# --- extend ----------------------------------------------------------------------------------------


async def test_extend_sets_deadline_from_now(client, db):
    job = await enqueue(client)
    got = await lease_one(client, visibility_timeout=5)
    body = {"id": job["id"], "lease_token": got["lease_token"]}
    t0 = await db_now(db)
    r = await client.post("/extend", json={**body, "visibility_timeout": 600})
    t1 = await db_now(db)
    assert r.status_code == 200, r.text
    rec = await row(db, job["id"])
    assert r.json()["id"] == job["id"] and ts(r.json()["lease_expires_at"]) == rec["lease_expires_at"]
    assert t0 + timedelta(seconds=600) <= rec["lease_expires_at"] <= t1 + timedelta(seconds=600)
    # the limit itself is accepted
    r = await client.post("/extend", json={**body, "visibility_timeout": 43200})
    assert r.status_code == 200, r.text
    for bad in ({"visibility_timeout": 43201}, {"visibility_timeout": 0}, {}):
        assert_problem(await client.post("/extend", json={**body, **bad}), 422, "validation_error")
    before = dict(await row(db, job["id"]))
    assert before["status"] == "running"
    assert token_text(before["lease_token"], before["queue"]) == got["lease_token"]
    r = await client.post("/extend", json={"id": job["id"], "lease_token": tok(), "visibility_timeout": 9})
    assert_problem(r, 409, "lease_lost")
    r = await client.post("/extend", json={"id": MISSING_ID, "lease_token": tok(), "visibility_timeout": 9})
    assert_problem(r, 404, "not_found")
    assert dict(await row(db, job["id"])) == before
    r = await client.post("/ack", json=body)
    assert r.status_code == 200, r.text


# --- batches ---------------------------------------------------------------------------------------


async def test_ack_batch_mixed_results_in_order(client, db):
    a = await enqueue(client, payload="a")
    b = await enqueue(client, payload="b")
    la, lb = await lease(client, max_jobs=2)
    assert (la["id"], lb["id"]) == (a["id"], b["id"])
    items = [
        {"id": a["id"], "lease_token": la["lease_token"]},
        {"id": b["id"], "lease_token": tok()},
        {"id": MISSING_ID, "lease_token": tok()},
    ]
    r = await client.post("/ack/batch", json={"items": items})
    assert results_of(r) == [
        {"id": a["id"], "ok": True},
        {"id": b["id"], "ok": False, "code": "lease_lost"},
        {"id": MISSING_ID, "ok": False, "code": "not_found"},
    ]
    assert (await row(db, a["id"]))["status"] == "completed"
    rb = await row(db, b["id"])
    assert (rb["status"], token_text(rb["lease_token"], rb["queue"])) == ("running", lb["lease_token"])


async def test_nack_batch_mixed_results_in_order(client, db):
    a = await enqueue(client, payload="a")
    b = await enqueue(client, payload="b")
    la, lb = await lease(client, max_jobs=2)
    items = [
        {"id": a["id"], "lease_token": la["lease_token"], "error": "bad", "retry_after": 60},
        {"id": b["id"], "lease_token": tok(), "error": "x"},
        {"id": MISSING_ID, "lease_token": tok()},
    ]
    r = await client.post("/nack/batch", json={"items": items})
    assert results_of(r) == [
        {"id": a["id"], "ok": True},
        {"id": b["id"], "ok": False, "code": "lease_lost"},
        {"id": MISSING_ID, "ok": False, "code": "not_found"},
    ]
    ra = await row(db, a["id"])
    assert (ra["status"], ra["last_error"]) == ("pending", "bad")
    rb = await row(db, b["id"])
    assert (rb["status"], rb["last_error"]) == ("running", None)
    assert token_text(rb["lease_token"], rb["queue"]) == lb["lease_token"]


@pytest.mark.parametrize("path", ["/ack/batch", "/nack/batch"])
@pytest.mark.parametrize("count", [0, 1001])
async def test_batch_size_limits(client, path, count):
    items = [{"id": i + 1, "lease_token": tok()} for i in range(count)]
    assert_problem(await client.post(path, json={"items": items}), 422, "validation_error")


async def test_batch_of_1000_is_accepted(client):
    items = [{"id": MISSING_ID + i, "lease_token": tok()} for i in range(1000)]
    r = await client.post("/ack/batch", json={"items": items})
    assert results_of(r) == [{"id": i["id"], "ok": False, "code": "not_found"} for i in items]


# --- lease expiry ----------------------------------------------------------------------------------


async def test_stale_worker_is_fenced(client, db):
    job = await enqueue(client)
    first = await lease_one(client, visibility_timeout=1, worker_id="w1")
    rec = await wait_for_status(db, job["id"], "pending")
    assert rec["attempts"] == 1 and "expired" in rec["last_error"]
    second = await lease_one(client, worker_id="w2")
    assert second["id"] == job["id"] and second["attempts"] == 2
    assert second["lease_token"] != first["lease_token"]
    assert "expired" in second["last_error"]
    before = dict(await row(db, job["id"]))
    r = await client.post("/ack", json={"id": job["id"], "lease_token": first["lease_token"]})
    assert_problem(r, 409, "lease_lost")
    after = dict(await row(db, job["id"]))
    assert after == before
    assert (after["status"], after["worker_id"]) == ("running", "w2")
    assert token_text(after["lease_token"], after["queue"]) == second["lease_token"]
    r = await client.post("/ack", json={"id": job["id"], "lease_token": second["lease_token"]})
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    assert (await row(db, job["id"]))["status"] == "completed"


async def test_late_ack_completes_an_expired_job_nobody_leased(client, db):
    job = await enqueue(client)
    got = await lease_one(client, visibility_timeout=1)
    rec = await wait_for_status(db, job["id"], "pending")
    assert "lease expired" in rec["last_error"] and rec["attempts"] == 1
    body = {"id": job["id"], "lease_token": got["lease_token"]}
    # nack and extend need the job still running under that token
    assert_problem(await client.post("/nack", json={**body, "retry_after": 0}), 409, "lease_lost")
    assert_problem(await client.post("/extend", json={**body, "visibility_timeout": 30}), 409, "lease_lost")
    assert (await row(db, job["id"]))["status"] == "pending"
    r = await client.post("/ack", json=body)
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    rec = await row(db, job["id"])
    assert rec["status"] == "completed" and rec["completed_at"] is not None
    assert await lease(client) == []


async def test_vanished_worker_goes_dead_after_max_attempts(client, db):
    job = await enqueue(client, "vanish", max_attempts=2)
    got = await lease_one(client, "vanish", visibility_timeout=1)
    assert got["attempts"] == 1 and got["max_attempts"] == 2
    rec = await wait_for_status(db, job["id"], "pending")
    assert rec["attempts"] == 1 and "lease expired" in rec["last_error"]
    got = await lease_one(client, "vanish", visibility_timeout=1)
    assert got["attempts"] == 2 and "lease expired" in got["last_error"]
    rec = await wait_for_status(db, job["id"], "dead")
    assert rec["attempts"] == 2 and "lease expired" in rec["last_error"]
    assert await lease(client, "vanish") == []
    r = await client.get("/dead", params={"queue": "vanish"})
    assert r.status_code == 200, r.text
    (dead,) = r.json()["jobs"]
    assert dead["id"] == job["id"] and dead["status"] == "dead"
    assert dead["attempts"] == 2 and "lease expired" in dead["last_error"]
    r = await client.get("/dead")
    assert job["id"] in [j["id"] for j in r.json()["jobs"]]
    # the last holder's late ack still completes it: nobody leased or retried it since
    r = await client.post("/ack", json={"id": job["id"], "lease_token": got["lease_token"]})
    assert r.status_code == 200 and r.json() == {"id": job["id"], "status": "completed"}
    assert (await row(db, job["id"]))["status"] == "completed"
