"""Producers: POST /jobs, POST /jobs/batch, GET /jobs/{id}, DELETE /jobs/{id}, per the HTTP contract."""

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.helpers import assert_problem, count, enqueue, lease, row

pytestmark = pytest.mark.anyio

JOB_KEYS = {
    "id",
    "queue",
    "kind",
    "key",
    "status",
    "payload",
    "priority",
    "run_at",
    "attempts",
    "max_attempts",
    "dedup_key",
    "last_error",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "completed_at",
}
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def rfc3339(value: object) -> datetime:
    assert isinstance(value, str) and RFC3339.match(value), value
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.utcoffset() == timedelta(0), f"not UTC: {value}"
    return parsed


# --- POST /jobs: normal paths ----------------------------------------------------------------------


async def test_enqueue_201_body(client, db):
    before = datetime.now(UTC)
    r = await client.post("/jobs", json={"queue": "emails", "payload": {"to": "a@b.c"}})
    assert r.status_code == 201, r.text
    assert r.headers["content-type"].startswith("application/json")
    job = r.json()
    assert JOB_KEYS <= job.keys()
    assert isinstance(job["id"], int) and not isinstance(job["id"], bool) and job["id"] >= 1
    assert job["queue"] == "emails" and job["status"] == "pending"
    assert job["payload"] == {"to": "a@b.c"}
    assert job["priority"] == 0 and job["attempts"] == 0
    assert job["max_attempts"] == 5  # the default of a queue nobody configured
    assert job["dedup_key"] is None and job["last_error"] is None and job["kind"] is None
    assert job["lease_expires_at"] is None and job["completed_at"] is None
    assert job["duplicate"] is False
    for field in ("run_at", "created_at", "updated_at"):
        t = rfc3339(job[field])
        assert before - timedelta(seconds=5) < t < datetime.now(UTC) + timedelta(seconds=5)
    assert rfc3339(job["run_at"]) <= datetime.now(UTC) + timedelta(seconds=1)

    rec = await row(db, job["id"])
    assert rec["queue"] == "emails" and rec["status"] == "pending" and rec["attempts"] == 0
    assert rec["max_attempts"] is None  # NULL: the queue's default
    assert json.loads(rec["payload"]) == {"to": "a@b.c"}
    assert await count(db) == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'emails'") == 1

    r = await client.get(f"/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    got = r.json()
    assert JOB_KEYS <= got.keys()
    assert {k: got[k] for k in JOB_KEYS} == {k: job[k] for k in JOB_KEYS}


async def test_enqueue_all_fields(client, db):
    job = await enqueue(
        client,
        queue="a.B_c:d-9",
        payload=[1],
        priority=-7,
        max_attempts=3,
        dedup_key="k1",
        run_at="2030-01-01T12:00:00+02:00",
    )
    assert job["queue"] == "a.B_c:d-9" and job["priority"] == -7 and job["max_attempts"] == 3
    assert job["dedup_key"] == "k1" and job["status"] == "pending"
    assert rfc3339(job["run_at"]) == datetime(2030, 1, 1, 10, tzinfo=UTC)
    rec = await row(db, job["id"])
    assert rec["priority"] == -7 and rec["max_attempts"] == 3 and rec["dedup_key"] == "k1"
    assert rec["run_at"] == datetime(2030, 1, 1, 10, tzinfo=UTC)


async def test_queue_name_of_128_chars_is_valid(client):
    job = await enqueue(client, queue="x" * 128)
    assert job["queue"] == "x" * 128


@pytest.mark.parametrize(
    "payload",
    [
        None,
        True,
        False,
        0,
        -17,
        3.5,
        2**53,
        "",
        "héllo ✓ 😀",
        [],
        {},
        [1, "a", None, {"b": [True]}],
        {"nested": {"deep": {"list": [1.25, {"x": None}]}, "empty": {}}, "s": 'q"uote\\'},
    ],
    ids=lambda p: type(p).__name__,
)
async def test_payload_any_json_stored_verbatim(client, db, payload):
    job = await enqueue(client, payload=payload)
    assert job["payload"] == payload and type(job["payload"]) is type(payload)
    rec = await row(db, job["id"])
    assert json.loads(rec["payload"]) == payload
    r = await client.get(f"/jobs/{job['id']}")
    assert r.json()["payload"] == payload and type(r.json()["payload"]) is type(payload)
    (leased,) = await lease(client)
    assert leased["payload"] == payload


async def test_payload_null_is_stored_as_json_null(client, db):
    job = await enqueue(client, payload=None)
    assert job["payload"] is None
    assert (
        await db.fetchval("SELECT jsonb_typeof(payload) FROM jobq.all_jobs WHERE id = $1", job["id"])
        == "null"
    )


@pytest.mark.parametrize("schedule", ["run_at", "delay"])
async def test_future_job_waits_until_run_at(client, db, schedule):
    if schedule == "run_at":
        body = {"run_at": (datetime.now(UTC) + timedelta(seconds=1)).isoformat()}
    else:
        body = {"delay": 1}
    job = await enqueue(client, **body)
    due = rfc3339(job["run_at"])
    assert job["status"] == "pending"
    assert datetime.now(UTC) + timedelta(seconds=0.3) < due < datetime.now(UTC) + timedelta(seconds=2)
    assert await count(db, "status = 'pending' AND run_at > now()") == 1
    assert await lease(client) == []
    deadline = time.monotonic() + 10
    while True:
        got = await lease(client)
        if got:
            break
        assert time.monotonic() < deadline, "the job was never leased after run_at"
        await asyncio.sleep(0.1)
    assert [j["id"] for j in got] == [job["id"]]
    assert datetime.now(UTC) >= due - timedelta(milliseconds=50)
    assert (await row(db, job["id"]))["status"] == "running"


async def test_run_at_in_the_past_is_ready_now(client):
    job = await enqueue(client, run_at="2000-01-01T00:00:00Z")
    assert [j["id"] for j in await lease(client)] == [job["id"]]


@pytest.mark.parametrize("path", ["/jobs", "/jobs/batch"])
@pytest.mark.parametrize("dedup", [False, True])
async def test_run_at_is_from_1970_to_the_end_of_9999(client, db, path, dedup):
    """The ends of Python's datetime range are PostgreSQL's -infinity and infinity to asyncpg: a job at
    year 1 was stored at -infinity, answered without its offset, and broke GET /queues."""

    async def send(run_at: str) -> httpx.Response:
        job = {"queue": "q", "payload": 1, "run_at": run_at} | ({"dedup_key": run_at} if dedup else {})
        return await client.post(path, json={"jobs": [job]} if path == "/jobs/batch" else job)

    for run_at, why in [
        ("0001-01-01T00:00:00Z", "1970-01-01T00:00:00Z or later"),
        ("0001-01-01T00:00:00+01:00", "1970-01-01T00:00:00Z or later"),
        ("1969-12-31T23:59:59.999999Z", "1970-01-01T00:00:00Z or later"),
        ("9999-12-31T23:59:59.999999Z", "9999-12-31T00:00:00Z or earlier"),
        ("9999-12-30T23:00:01-01:00", "9999-12-31T00:00:00Z or earlier"),
    ]:
        r = await send(run_at)
        assert r.status_code == 422, r.text
        assert why in r.json()["detail"] and r.json()["errors"][0]["loc"][-1] == "run_at"
    assert await count(db) == 0
    for run_at in ["1970-01-01T00:00:00Z", "9999-12-31T00:00:00Z"]:
        r = await send(run_at)
        assert r.status_code == 201, r.text
        job = r.json()["jobs"][0] if path == "/jobs/batch" else r.json()
        assert rfc3339(job["run_at"]) == rfc3339(run_at) and job["run_at"].endswith("Z")
    r = await client.get("/queues")
    assert r.status_code == 200, r.text
    (queue,) = r.json()
    assert queue["pending"] == 1 and queue["scheduled"] == 1 and queue["oldest_pending_age_seconds"] > 1.7e9


# --- dedup -----------------------------------------------------------------------------------------


async def test_dedup_duplicate_returns_200_and_same_job(client, db):
    first = await enqueue(client, payload=1, dedup_key="k")
    r = await client.post("/jobs", json={"queue": "q", "payload": 2, "dedup_key": "k"})
    assert r.status_code == 200, r.text
    dup = r.json()
    assert dup["duplicate"] is True and dup["id"] == first["id"]
    assert dup["payload"] == 1 and dup["status"] == "pending"
    assert await count(db) == 1
    # other queues have their own keys
    other = await enqueue(client, queue="other", dedup_key="k")
    assert other["id"] != first["id"] and other["duplicate"] is False
    assert await count(db) == 2


async def test_dedup_holds_while_running_and_frees_after_completion(client, db):
    first = await enqueue(client, dedup_key="k")
    (leased,) = await lease(client)
    r = await client.post("/jobs", json={"queue": "q", "payload": 2, "dedup_key": "k"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == first["id"] and r.json()["status"] == "running" and r.json()["duplicate"] is True
    r = await client.post("/ack", json={"id": leased["id"], "lease_token": leased["lease_token"]})
    assert r.status_code == 200, r.text
    r = await client.post("/jobs", json={"queue": "q", "payload": 3, "dedup_key": "k"})
    assert r.status_code == 201, r.text
    assert r.json()["id"] != first["id"] and r.json()["duplicate"] is False
    assert await count(db, "dedup_key = 'k'") == 2
    assert await count(db, "dedup_key = 'k' AND status = 'pending'") == 1


async def test_dedup_key_free_after_cancel(client, db):
    first = await enqueue(client, dedup_key="k")
    assert (await client.delete(f"/jobs/{first['id']}")).status_code == 200
    second = await enqueue(client, dedup_key="k")
    assert second["id"] != first["id"]


# --- kind ------------------------------------------------------------------------------------------


async def test_kind_is_stored_and_shown(client, db):
    job = await enqueue(client, "emails", {"to": "ada"}, kind="send_email")
    assert job["kind"] == "send_email"
    assert (await row(db, job["id"]))["kind"] == "send_email"
    assert (await client.get(f"/jobs/{job['id']}")).json()["kind"] == "send_email"
    # With an idempotency key (another statement), and its repeat, rebuilt from the request.
    body = {"queue": "emails", "payload": 2, "kind": "send.sms:v2"}
    headers = {"Idempotency-Key": "kind-1"}
    first = await client.post("/jobs", json=body, headers=headers)
    again = await client.post("/jobs", json=body, headers=headers)
    assert first.status_code == again.status_code == 201, first.text
    assert first.json()["kind"] == again.json()["kind"] == "send.sms:v2"
    assert first.content == again.content
    # The same key with another kind is another request.
    assert_problem(
        await client.post("/jobs", json=body | {"kind": "other"}, headers=headers), 409, "conflict"
    )
    plain = await enqueue(client, "emails", 3)
    assert plain["kind"] is None and (await row(db, plain["id"]))["kind"] is None
    assert await count(db) == 3
    cancelled = (await client.delete(f"/jobs/{job['id']}")).json()
    assert cancelled["status"] == "cancelled" and cancelled["kind"] == "send_email"


async def test_kind_of_128_chars_is_valid(client, db):
    job = await enqueue(client, kind="a.B_c:d-9" + "x" * 119)
    assert job["kind"] == "a.B_c:d-9" + "x" * 119


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "with-dedup-keys"])
async def test_batch_kinds_per_item(client, db, dedup):
    kinds = ["resize", None, "email.send", "resize"]
    items = [
        {"queue": "q", "payload": i} | ({"kind": k} if k else {}) | ({"dedup_key": f"d{i}"} if dedup else {})
        for i, k in enumerate(kinds)
    ]
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    jobs = r.json()["jobs"]
    assert [j["kind"] for j in jobs] == kinds
    for j in jobs:
        assert (await row(db, j["id"]))["kind"] == j["kind"]
        assert (await client.get(f"/jobs/{j['id']}")).json()["kind"] == j["kind"]
    assert await count(db) == 4
    # All without kind: the column goes in as NULL.
    r = await client.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 9}]})
    assert r.json()["jobs"][0]["kind"] is None
    assert await count(db, "kind IS NULL") == 2


async def test_duplicate_answers_with_the_holders_kind(client, db):
    first = await enqueue(client, payload=1, dedup_key="k", kind="first")
    r = await client.post("/jobs", json={"queue": "q", "payload": 2, "dedup_key": "k", "kind": "second"})
    assert r.status_code == 200, r.text
    assert r.json()["duplicate"] is True and r.json()["id"] == first["id"]
    assert r.json()["kind"] == "first"
    r = await client.post("/jobs", json={"queue": "q", "payload": 3, "dedup_key": "k"})
    assert r.status_code == 200 and r.json()["kind"] == "first"
    assert await count(db) == 1


@pytest.mark.parametrize("kind", ["", "x" * 129, "has space", "a/b", "ünïcode", "k\n", 5, ["k"]])
async def test_bad_kind_is_422(client, db, kind):
    body = assert_problem(
        await client.post("/jobs", json={"queue": "q", "payload": 1, "kind": kind}), 422, "validation_error"
    )
    assert "kind" in body["detail"], body["detail"]
    items = [{"queue": "q", "payload": 1, "kind": "ok"}, {"queue": "q", "payload": 2, "kind": kind}]
    body = assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 422, "validation_error")
    assert "jobs.1.kind" in body["detail"], body["detail"]
    assert await count(db) == 0


# --- POST /jobs/batch ------------------------------------------------------------------------------


async def test_batch_in_request_order(client, db):
    items = [{"queue": "q", "payload": i, "priority": 10 - i} for i in range(5)]
    items.append({"queue": "other", "payload": "x"})
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    jobs = r.json()["jobs"]
    assert [j["payload"] for j in jobs] == [0, 1, 2, 3, 4, "x"]
    assert [j["queue"] for j in jobs] == ["q"] * 5 + ["other"]
    assert all(j["duplicate"] is False and j["status"] == "pending" for j in jobs)
    assert len({j["id"] for j in jobs}) == 6
    assert await count(db) == 6
    for j in jobs:
        rec = await row(db, j["id"])
        assert json.loads(rec["payload"]) == j["payload"] and rec["queue"] == j["queue"]


async def test_batch_answer_is_each_job_as_get_shows_it(client, db):
    """A batch's answer is written from a template per shape of job (app/service/inserts.py NewJobs): each
    job in it must read exactly as GET /jobs/{id} shows the job, whatever its fields."""
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    items = [
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
        {"queue": "q", "payload": "ünïcode ✓", "kind": "send_email", "key": "tenant-ä"},
        {"queue": "q", "payload": 2**70, "priority": -5, "max_attempts": 9},
        {"queue": "other:q", "payload": None, "run_at": later},
        {"queue": "q", "payload": [1, {"deep": [True, False, None]}], "delay": 30},
        {"queue": "q", "payload": {"n": 3}},
    ]
    await client.patch("/queues/q", json={"max_attempts": 7})
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    answered = r.json()["jobs"]
    assert [j["payload"] for j in answered] == [item["payload"] for item in items]
    for job in answered:
        shown = (await client.get(f"/jobs/{job['id']}")).json()
        assert job == {**shown, "duplicate": False}
    assert [j["max_attempts"] for j in answered] == [7, 7, 7, 9, 5, 7, 7]


async def test_batch_repeated_dedup_key_is_duplicate_of_first(client, db):
    items = [
        {"queue": "q", "payload": "first", "dedup_key": "a"},
        {"queue": "q", "payload": "b", "dedup_key": "b"},
        {"queue": "q", "payload": "second", "dedup_key": "a"},
        {"queue": "q2", "payload": "other queue", "dedup_key": "a"},
    ]
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    j = r.json()["jobs"]
    assert [x["duplicate"] for x in j] == [False, False, True, False]
    assert j[2]["id"] == j[0]["id"] and j[2]["payload"] == "first"
    assert len({j[0]["id"], j[1]["id"], j[3]["id"]}) == 3
    assert await count(db) == 3
    # against an existing active job
    r = await client.post(
        "/jobs/batch",
        json={"jobs": [{"queue": "q", "payload": 9, "dedup_key": "a"}, {"queue": "q", "payload": 10}]},
    )
    assert r.status_code == 201, r.text
    j2 = r.json()["jobs"]
    assert j2[0]["duplicate"] is True and j2[0]["id"] == j[0]["id"] and j2[1]["duplicate"] is False
    assert await count(db) == 4


async def test_batch_all_or_nothing_on_invalid_item(client, db):
    items = [
        {"queue": "q", "payload": 1},
        {"queue": "q", "payload": 2, "priority": "high"},
        {"queue": "q", "payload": 3},
    ]
    assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 422, "validation_error")
    items = [{"queue": "q", "payload": 1}, {"queue": "bad name", "payload": 2}]
    assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 422, "validation_error")
    items = [
        {"queue": "q", "payload": 1},
        {"queue": "q", "payload": 2, "delay": 1, "run_at": "2030-01-01T00:00:00Z"},
    ]
    assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 422, "validation_error")
    assert await count(db) == 0
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0


async def test_batch_all_or_nothing_on_payload_too_large(start_service, db):
    service = start_service(max_payload_bytes=1000)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        items = [
            {"queue": "q", "payload": "small"},
            {"queue": "q", "payload": "x" * 2000},
            {"queue": "q", "payload": "small"},
        ]
        assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 413, "payload_too_large")
        assert await count(db) == 0
        r = await client.post("/jobs/batch", json={"jobs": [items[0], items[2]]})
        assert r.status_code == 201, r.text
        assert await count(db) == 2


@pytest.mark.parametrize("size", [0, 1001])
async def test_batch_size_limits(client, db, size):
    items = [{"queue": "q", "payload": i} for i in range(size)]
    assert_problem(await client.post("/jobs/batch", json={"jobs": items}), 422, "validation_error")
    assert await count(db) == 0


async def test_batch_of_1000_is_accepted(client, db):
    items = [{"queue": "q", "payload": i} for i in range(1000)]
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    assert [j["payload"] for j in r.json()["jobs"]] == list(range(1000))
    assert await count(db) == 1000


@pytest.mark.parametrize("body", [{}, {"jobs": None}, {"jobs": {}}, {"jobs": [], "extra": 1}, []])
async def test_batch_malformed_bodies(client, db, body):
    assert_problem(await client.post("/jobs/batch", json=body), 422, "validation_error")
    assert await count(db) == 0


# --- POST /jobs: errors ----------------------------------------------------------------------------


async def test_payload_too_large(start_service, db):
    service = start_service(max_payload_bytes=1000)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.post("/jobs", json={"queue": "q", "payload": "x" * 2000})
        assert_problem(r, 413, "payload_too_large")
        r = await client.post("/jobs", json={"queue": "q", "payload": {"k": ["y" * 600, "z" * 600]}})
        assert_problem(r, 413, "payload_too_large")
        assert await count(db) == 0
        r = await client.post("/jobs", json={"queue": "q", "payload": "x" * 900})
        assert r.status_code == 201, r.text
        assert await count(db) == 1


async def test_default_payload_limit_is_256_kib(client, db):
    r = await client.post("/jobs", json={"queue": "q", "payload": "x" * (256 * 1024 + 10)})
    assert_problem(r, 413, "payload_too_large")
    r = await client.post("/jobs", json={"queue": "q", "payload": "x" * (250 * 1024)})
    assert r.status_code == 201, r.text
    assert await count(db) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"queue": "q"},  # payload missing
        {"payload": 1},  # queue missing
        {"queue": "q", "payload": 1, "run_at": "2030-01-01T00:00:00Z", "delay": 5},
        {"queue": "q", "payload": 1, "run_at": "2030-01-01T00:00:00"},  # naive
        {"queue": "q", "payload": 1, "run_at": "tomorrow"},
        {"queue": "q", "payload": 1, "delay": -1},
        {"queue": "q", "payload": 1, "delay": "soon"},
        {"queue": "q", "payload": 1, "priority": "high"},
        {"queue": "q", "payload": 1, "priority": 2**31},
        {"queue": "q", "payload": 1, "max_attempts": 0},
        {"queue": "q", "payload": 1, "max_attempts": -3},
        {"queue": "q", "payload": 1, "dedup_key": ""},
        {"queue": "q", "payload": 1, "dedup_key": 5},
        {"queue": 123, "payload": 1},
        {"queue": None, "payload": 1},
        {"queue": "", "payload": 1},
        {"queue": "x" * 129, "payload": 1},
        {"queue": "has space", "payload": 1},
        {"queue": "a/b", "payload": 1},
        {"queue": "ünïcode", "payload": 1},
        {"queue": "q\n", "payload": 1},
        {"queue": "q", "payload": 1, "unknown": True},
        {"queue": "q", "payload": 1, "status": "completed"},
        [{"queue": "q", "payload": 1}],
        "just a string",
    ],
)
async def test_enqueue_validation_errors(client, db, body):
    assert_problem(await client.post("/jobs", json=body), 422, "validation_error")
    assert await count(db) == 0


@pytest.mark.parametrize(
    "raw",
    [b'{"queue": "q", "payload": ', b"not json", b"", b'{"queue": "q", "payload": 1,}', b"\xff\xfe{}"],
)
async def test_malformed_json_body(client, db, raw):
    r = await client.post("/jobs", content=raw, headers={"content-type": "application/json"})
    assert_problem(r, 422, "validation_error")
    assert await count(db) == 0


@pytest.mark.parametrize(
    ("raw", "content_type", "detail"),
    [
        (
            b'{"queue": "q", "payload": 1,}',
            "application/json",
            "invalid JSON at line 1, column 29: expecting property name",
        ),
        (
            b'{\n  "queue": "q",\n  "payload": 1\n  "x": 2}',
            "application/json",
            "invalid JSON at line 4, column 3: expecting ',' delimiter",
        ),
        (
            b'{"queue": "q", "payload": ' + b"[" * 100 + b"]" * 100 + b"}",
            "application/json",
            "the body is not valid JSON: nesting deeper than 64 levels",
        ),
        (
            b'{"queue": "q", "payload": "\xff"}',
            "application/json",
            "the body is not valid JSON: it is not UTF-8 text",
        ),
        (
            b'{"queue": "q", "payload": 1}',
            "text/plain",
            "send the body as JSON, with Content-Type: application/json (this request's is 'text/plain')",
        ),
        (
            b'{"queue": "q", "payload": 1}',
            "",
            "send the body as JSON, with Content-Type: application/json (this request has none)",
        ),
    ],
    ids=["comma", "lines", "depth", "utf-8", "text/plain", "no-type"],
)
async def test_a_body_that_is_not_json_says_why(client, db, raw, content_type, detail):
    """In words a sender can act on: where the text stops being JSON (line and column, not an offset shown
    as a field), and why; too deep; not sent as JSON at all. Both ways in (app/http/fastpath/hot.py), one
    wording."""
    for path, body in (("/jobs", raw), ("/lease", raw.replace(b'"payload"', b'"max_jobs"'))):
        r = await client.post(path, content=body, headers={"content-type": content_type})
        assert_problem(r, 422, "validation_error")
        if path == "/jobs":
            assert r.json()["detail"].startswith(detail), r.json()["detail"]
        else:
            assert r.json()["detail"].startswith(detail.split(" at ")[0].split(":")[0]), r.json()["detail"]
    assert await count(db) == 0


@pytest.mark.parametrize(
    "body",
    [
        {"queue": "q", "payload": "a\u0000b"},
        {"queue": "q", "payload": {"k\u0000": 1}},
        {"queue": "q", "payload": 1, "dedup_key": "a\u0000b"},
    ],
    ids=["payload-string", "payload-key", "dedup_key"],
)
async def test_nul_character_is_a_4xx(client, db, body):
    assert_problem(await client.post("/jobs", json=body), 422, "validation_error")
    r = await client.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 1}, body]})
    assert_problem(r, 422, "validation_error")
    assert await count(db) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"queue": "q", "payload": "\\ud800"}',
        b'{"queue": "q", "payload": {"\\udfff": 1}}',
        b'{"queue": "q", "payload": 1, "dedup_key": "x\\ud800"}',
    ],
)
async def test_lone_surrogate_is_a_4xx(client, db, raw):
    r = await client.post("/jobs", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert_problem(r, r.status_code, r.json().get("code"))
    assert await count(db) == 0


async def test_deeply_nested_payload_is_a_4xx(client, db):
    depth = 100_000
    raw = b'{"queue": "q", "payload": ' + b"[" * depth + b"]" * depth + b"}"
    r = await client.post("/jobs", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text[:500]
    assert_problem(r, r.status_code, r.json().get("code"))
    raw = b'{"queue": "q", "payload": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
    r = await client.post("/jobs", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text[:500]
    assert await count(db) == 0
    # the service is still fine afterwards
    await enqueue(client)


# --- GET /jobs/{id} --------------------------------------------------------------------------------


async def test_get_unknown_job_404(client):
    assert_problem(await client.get("/jobs/999999"), 404, "not_found")


@pytest.mark.parametrize("job_id", ["abc", "0", "-1", "1.5", str(2**63), str(2**64), "1e3"])
async def test_get_bad_id_422(client, job_id):
    assert_problem(await client.get(f"/jobs/{job_id}"), 422, "validation_error")


async def test_get_job_reflects_lease(client):
    job = await enqueue(client)
    (leased,) = await lease(client, visibility_timeout=60)
    got = (await client.get(f"/jobs/{job['id']}")).json()
    assert got["status"] == "running" and got["attempts"] == 1
    assert rfc3339(got["lease_expires_at"]) == rfc3339(leased["lease_expires_at"])
    assert "lease_token" not in got or got["lease_token"] is None or isinstance(got["lease_token"], str)


# --- DELETE /jobs/{id} -----------------------------------------------------------------------------


async def test_cancel_pending(client, db):
    job = await enqueue(client, delay=3600)
    r = await client.delete(f"/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == job["id"] and body["status"] == "cancelled"
    assert rfc3339(body["completed_at"])
    rec = await row(db, job["id"])
    assert rec["status"] == "cancelled" and rec["completed_at"] is not None
    assert (await client.get(f"/jobs/{job['id']}")).json()["status"] == "cancelled"
    assert await lease(client) == []
    # cancelling again: no longer pending
    assert_problem(await client.delete(f"/jobs/{job['id']}"), 409, "conflict")


async def test_cancel_running_is_conflict(client, db):
    job = await enqueue(client)
    await lease(client)
    before = dict(await row(db, job["id"]))
    assert_problem(await client.delete(f"/jobs/{job['id']}"), 409, "conflict")
    assert dict(await row(db, job["id"])) == before
    assert before["status"] == "running"


async def test_cancel_completed_is_conflict(client, db):
    job = await enqueue(client)
    (leased,) = await lease(client)
    r = await client.post("/ack", json={"id": job["id"], "lease_token": leased["lease_token"]})
    assert r.status_code == 200, r.text
    before = dict(await row(db, job["id"]))
    assert_problem(await client.delete(f"/jobs/{job['id']}"), 409, "conflict")
    assert dict(await row(db, job["id"])) == before
    assert before["status"] == "completed"


async def test_cancel_dead_is_conflict(client, db):
    job = await enqueue(client, max_attempts=1)
    (leased,) = await lease(client)
    r = await client.post("/nack", json={"id": job["id"], "lease_token": leased["lease_token"]})
    assert r.status_code == 200 and r.json()["status"] == "dead", r.text
    assert_problem(await client.delete(f"/jobs/{job['id']}"), 409, "conflict")
    assert (await row(db, job["id"]))["status"] == "dead"


async def test_cancel_unknown_404_and_bad_id_422(client):
    assert_problem(await client.delete("/jobs/424242"), 404, "not_found")
    assert_problem(await client.delete("/jobs/abc"), 422, "validation_error")
    assert_problem(await client.delete(f"/jobs/{2**63}"), 422, "validation_error")


# --- key -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "with-dedup-keys"])
async def test_key_is_stored_and_shown_per_item(client, db, dedup):
    keys = ["customer-42", None, "ü" * 256, "customer-42"]
    items = [
        {"queue": "q", "payload": i} | ({"key": k} if k else {}) | ({"dedup_key": f"d{i}"} if dedup else {})
        for i, k in enumerate(keys)
    ]
    r = await client.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 201, r.text
    assert [j["key"] for j in r.json()["jobs"]] == keys
    for j in r.json()["jobs"]:
        assert (await row(db, j["id"]))["key"] == j["key"]
        assert (await client.get(f"/jobs/{j['id']}")).json()["key"] == j["key"]
    single = await enqueue(client, payload=9, key="tenant a")
    assert single["key"] == "tenant a" and (await row(db, single["id"]))["key"] == "tenant a"
    # An Idempotency-Key's request includes the key: the same call with another key is another request.
    body, headers = {"queue": "q", "payload": 1, "key": "x"}, {"Idempotency-Key": "key-1"}
    assert (await client.post("/jobs", json=body, headers=headers)).status_code == 201
    assert (await client.post("/jobs", json=body, headers=headers)).status_code == 201
    assert_problem(await client.post("/jobs", json=body | {"key": "y"}, headers=headers), 409, "conflict")


@pytest.mark.parametrize("key", ["", "x" * 257, 5, ["k"], None])
async def test_bad_key_is_422(client, db, key):
    r = await client.post("/jobs", json={"queue": "q", "payload": 1, "key": key})
    if key is None:  # null is no key
        assert r.status_code == 201 and r.json()["key"] is None
        return
    assert "key" in assert_problem(r, 422, "validation_error")["detail"]
    assert await count(db) == 0
