"""W3C trace context kept with a job: given on enqueue (per job, or the request's `traceparent` header as
OpenTelemetry's HTTP instrumentation sends it, or to jobq.enqueue() in SQL), stored, and handed back on
the job and on each lease of it."""

import pytest

from tests.helpers import assert_problem, enqueue, lease_one, row

pytestmark = pytest.mark.anyio

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


async def test_a_jobs_trace_context_is_kept_and_handed_to_every_lease(client, db):
    job = await enqueue(client, "traced", {"n": 1}, traceparent=PARENT, tracestate=STATE)
    assert (job["traceparent"], job["tracestate"]) == (PARENT, STATE)
    stored = await row(db, job["id"])
    assert (stored["traceparent"], stored["tracestate"]) == (PARENT, STATE)
    got = (await client.get(f"/jobs/{job['id']}")).json()
    assert (got["traceparent"], got["tracestate"]) == (PARENT, STATE)
    leased = await lease_one(client, "traced")
    assert (leased["traceparent"], leased["tracestate"]) == (PARENT, STATE)
    r = await client.post(
        "/nack", json={"id": job["id"], "lease_token": leased["lease_token"], "retry_after": 0}
    )
    assert r.status_code == 200
    again = await lease_one(client, "traced")  # a retry is part of the same trace
    assert (again["attempts"], again["traceparent"], again["tracestate"]) == (2, PARENT, STATE)
    plain = await enqueue(client, "traced", None)
    assert (plain["traceparent"], plain["tracestate"]) == (None, None)


async def test_the_request_header_traces_jobs_that_give_none(client, db):
    headers = {"traceparent": PARENT, "tracestate": STATE}
    r = await client.post("/jobs", json={"queue": "h", "payload": 1}, headers=headers)
    assert r.status_code == 201 and (r.json()["traceparent"], r.json()["tracestate"]) == (PARENT, STATE)
    jobs = [{"queue": "h", "payload": 2}, {"queue": "h", "payload": 3, "traceparent": OTHER}]
    r = await client.post("/jobs/batch", json={"jobs": jobs}, headers=headers)
    assert r.status_code == 201, r.text
    first, second = r.json()["jobs"]
    assert (first["traceparent"], first["tracestate"]) == (PARENT, STATE)
    assert (second["traceparent"], second["tracestate"]) == (OTHER, None)  # its own, whole
    for job in (first, second):
        stored = await row(db, job["id"])
        assert (stored["traceparent"], stored["tracestate"]) == (job["traceparent"], job["tracestate"])
    # A header that is not a valid traceparent is ignored (W3C Trace Context), never refused.
    for bad in ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", "garbage", "ff-" + PARENT[3:]):
        r = await client.post("/jobs", json={"queue": "h", "payload": 4}, headers={"traceparent": bad})
        assert r.status_code == 201 and r.json()["traceparent"] is None, bad
    r = await client.post(
        "/jobs", json={"queue": "h", "payload": 5}, headers={"traceparent": PARENT, "tracestate": "x" * 600}
    )
    assert (r.json()["traceparent"], r.json()["tracestate"]) == (PARENT, None)


@pytest.mark.parametrize(
    "fields",
    [
        {"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"},  # upper case
        {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},  # version ff
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},  # no trace id
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"},  # no parent id
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"},  # no flags
        {"tracestate": STATE},  # without a traceparent
        {"traceparent": PARENT, "tracestate": "x" * 513},
        {"traceparent": PARENT, "tracestate": ""},
        {"traceparent": 1},
    ],
)
async def test_a_malformed_trace_context_in_the_body_is_refused(client, db, fields):
    r = await client.post("/jobs", json={"queue": "bad", "payload": None, **fields})
    assert_problem(r, 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_sql_enqueue_takes_the_trace_context(db, client):
    job_id = await db.fetchval(
        "SELECT jobq.enqueue('sql', '{}', traceparent => $1, tracestate => $2)", PARENT, STATE
    )
    leased = await lease_one(client, "sql", job_id)
    assert (leased["traceparent"], leased["tracestate"]) == (PARENT, STATE)
    with pytest.raises(Exception, match="ck_jobs_trace_context"):
        await db.fetchval("SELECT jobq.enqueue('sql', '{}', traceparent => 'not a traceparent')")


async def test_an_idempotent_retry_with_a_new_span_is_the_same_request(client, db):
    key = {"Idempotency-Key": "retry-1"}
    first = await client.post(
        "/jobs", json={"queue": "once", "payload": 1}, headers=key | {"traceparent": PARENT}
    )
    again = await client.post(
        "/jobs", json={"queue": "once", "payload": 1}, headers=key | {"traceparent": OTHER}
    )
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"]
    assert await db.fetchval("SELECT traceparent FROM jobq.all_jobs") == PARENT  # the first's, once
