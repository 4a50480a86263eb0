"""Hot routes (app/http/fastpath/hot.py): the worker and producer POSTs, answered outside FastAPI's routing.

A body sent as `application/json` takes the hot path; the same body sent as another JSON media type
(`application/x-test+json`, which FastAPI reads as JSON too) goes through FastAPI. Both must answer alike,
for successes and for every kind of refusal.
"""

import json

import httpx
import pytest

from app.http.fastpath.hot import hot_routes
from app.http.routers import operators, producers, workers

pytestmark = pytest.mark.anyio

HOT = {"content-type": "application/json"}
ROUTED = {"content-type": "application/x-test+json"}


def test_the_hot_routes_are_the_posts_with_a_fixed_path():
    table = hot_routes([producers.router, workers.router, operators.router])
    assert set(table) == {
        "/jobs",
        "/jobs/batch",
        "/lease",
        "/ack",
        "/ack/batch",
        "/nack",
        "/nack/batch",
        "/release",
        "/extend",
        "/dead/retry",
    }
    assert table["/lease"].wants == {"body", "runtime", "request", "caller"}
    assert {role.value for role in table["/jobs"].admits[0].roles} == {"producer", "admin"}


async def both_ways(http: httpx.AsyncClient, path: str, body: object, **headers: str) -> httpx.Response:
    """POST `body` the hot way and the routed way; the two answers must agree. Returns the hot one."""
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    hot = await http.post(path, content=raw, headers=HOT | headers)
    routed = await http.post(path, content=raw, headers=ROUTED | headers)
    assert (hot.status_code, hot.json()) == (routed.status_code, routed.json()), (hot.text, routed.text)
    for name in ("content-type", "www-authenticate", "retry-after"):
        assert hot.headers.get(name) == routed.headers.get(name), name
    return hot


UNKNOWN_LEASE = {"id": 424242, "lease_token": "0b7e4a5c-1a2b-4c3d-8e9f-0123456789ab"}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/lease", {"queue": "empty"}, 200),
        ("/lease", {"queue": "bad name!"}, 422),
        ("/lease", {"queue": "q", "max_jobs": 0}, 422),
        ("/lease", {"queue": "q", "surprise": 1}, 422),
        ("/ack", UNKNOWN_LEASE, 404),
        ("/ack", {"id": 424242, "lease_token": "not-a-token"}, 404),
        ("/ack", {"id": "1", "lease_token": "t"}, 422),
        ("/ack/batch", {"items": [UNKNOWN_LEASE]}, 200),
        ("/ack", UNKNOWN_LEASE | {"result": {"rows": [1, 2]}}, 404),
        ("/ack", UNKNOWN_LEASE | {"result": "x" * 70_000}, 413),
        ("/ack", UNKNOWN_LEASE | {"result": "a\u0000b"}, 422),
        ("/ack/batch", {"items": [UNKNOWN_LEASE | {"result": "x" * 70_000}, UNKNOWN_LEASE]}, 200),
        ("/extend", UNKNOWN_LEASE | {"visibility_timeout": 10, "progress": 0.5}, 404),
        ("/extend", UNKNOWN_LEASE | {"visibility_timeout": 10, "progress": "x" * 70_000}, 413),
        ("/release", {"items": [UNKNOWN_LEASE | {"result": 1}]}, 422),
        ("/nack", UNKNOWN_LEASE | {"error": "boom"}, 404),
        ("/nack/batch", {"items": [UNKNOWN_LEASE]}, 200),
        ("/extend", UNKNOWN_LEASE | {"visibility_timeout": 10}, 404),
        ("/extend", UNKNOWN_LEASE | {"visibility_timeout": 10**9}, 422),
        ("/release", {"items": [UNKNOWN_LEASE]}, 200),
        ("/jobs", {"queue": "q"}, 422),
        ("/jobs", {"queue": "q", "payload": 1, "run_at": "2030-01-01T00:00:00Z", "delay": 5}, 422),
        ("/jobs", {"queue": "q", "payload": "a\u0000b"}, 422),
        ("/jobs/batch", {"jobs": []}, 422),
        ("/dead/retry", {}, 422),
        ("/dead/retry", {"ids": [424242]}, 200),
        ("/lease", b"[1, 2", 422),
        ("/lease", b'{"queue": "q", "wait": NaN}', 422),
        ("/jobs", b'{"queue": "q", "payload": "\\ud800"}', 422),
        ("/ack", b'{"id": 424242, "lease_token": "t", "result": "\\ud800"}', 422),
    ],
)
async def test_answers_agree(client, db, path, body, status):
    assert (await both_ways(client, path, body)).status_code == status
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_a_body_the_hot_parser_refuses_is_still_taken(client, db):
    """Integers beyond 64 bits and lone surrogates aside, what FastAPI accepts the hot path accepts or
    hands on: a job enqueued either way is the same job."""
    body = {"queue": "q", "payload": {"n": 2**70, "s": "é\U0001f600", "f": 0.1}, "priority": 3}
    hot = await client.post("/jobs", content=json.dumps(body), headers=HOT)
    routed = await client.post("/jobs", content=json.dumps(body), headers=ROUTED)
    assert hot.status_code == routed.status_code == 201
    strip = {"id", "run_at", "created_at", "updated_at"}
    assert {k: v for k, v in hot.json().items() if k not in strip} == {
        k: v for k, v in routed.json().items() if k not in strip
    }
    assert json.loads(hot.text)["payload"]["n"] == 2**70
    rows = await db.fetch("SELECT payload::text FROM jobq.all_jobs ORDER BY id")
    assert rows[0][0] == rows[1][0]


async def test_enqueue_bodies_are_read_fast_and_their_payloads_kept_as_sent(client, db):
    """POST /jobs and /jobs/batch are read by app/http/fastpath/bodies.py: each payload stays the JSON text it
    came in, which the answer echoes, while PostgreSQL stores the same value as the model's way stores."""
    spaced = b'{"queue": "q", "payload": {"a":  [1,  2.50]}}'
    hot = await client.post("/jobs", content=spaced, headers=HOT)
    routed = await client.post("/jobs", content=spaced, headers=ROUTED)
    assert hot.status_code == routed.status_code == 201
    assert b'"payload":{"a":  [1,  2.50]}' in hot.content
    assert b'"payload":{"a":[1,2.50]}' in routed.content  # compact, every number as sent
    batch = await client.post("/jobs/batch", content=b'{"jobs": [' + spaced + b"]}", headers=HOT)
    assert batch.status_code == 201 and b'"payload":{"a":  [1,  2.50]}' in batch.content
    stored = await db.fetch("SELECT payload::text FROM jobq.all_jobs ORDER BY id")
    assert [json.loads(row[0]) for row in stored] == [{"a": [1, 2.5]}] * 3


async def test_no_content_type_goes_to_fastapi(client, db):
    r = await client.post("/jobs", content=b'{"queue": "q", "payload": 1}')
    routed = await client.post("/jobs", content=b'{"queue": "q", "payload": 1}', headers={"content-type": ""})
    assert r.status_code == routed.status_code == 422
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_roles_are_checked_alike(start_service):
    service = start_service(tokens={"p": "producer", "w": "worker"})
    async with httpx.AsyncClient(base_url=service.url) as http:
        assert (await both_ways(http, "/lease", {"queue": "q"})).status_code == 401
        wrong = await both_ways(http, "/lease", {"queue": "q"}, authorization="Bearer nope")
        assert wrong.status_code == 401
        forbidden = await both_ways(http, "/lease", {"queue": "q"}, authorization="Bearer p")
        assert forbidden.status_code == 403
        assert (await both_ways(http, "/lease", {"queue": "q"}, authorization="Bearer w")).status_code == 200
        # An invalid body and no token: the token is checked first, either way.
        assert (await both_ways(http, "/lease", {"queue": "bad name!"})).status_code == 401


async def test_queues_are_checked_alike(start_service, db):
    """A token limited to queues is refused another queue the same way hot and routed, in a body's
    queue and in each job of a batch; nothing is stored or leased."""
    scoped = {"roles": ["producer", "worker", "admin"], "queues": ["mine-*"]}
    service = start_service(tokens={"s": scoped, "a": "admin"})
    async with httpx.AsyncClient(base_url=service.url) as http:
        auth = {"authorization": "Bearer s"}
        await http.post("/jobs", json={"queue": "other", "payload": 0}, headers={"authorization": "Bearer a"})
        for path, body in (
            ("/jobs", {"queue": "other", "payload": 1}),
            ("/jobs/batch", {"jobs": [{"queue": "mine-1", "payload": 1}, {"queue": "other", "payload": 2}]}),
            ("/lease", {"queue": "other"}),
            ("/dead/retry", {"queue": "other"}),
        ):
            r = await both_ways(http, path, body, **auth)
            assert r.status_code == 403 and r.json()["allowed_queues"] == ["mine-*"], (path, r.text)
        assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'pending'") == 1
        for headers in (HOT, ROUTED):
            r = await http.post("/jobs", content=b'{"queue": "mine-1", "payload": 1}', headers=headers | auth)
            assert r.status_code == 201, r.text


async def read_both_ways(http: httpx.AsyncClient, job_id: int | str, wait: str | None, **headers: str):
    """GET a job the hot way (no query, or `wait=N`) and the routed way (the same wait spelled in a form
    the hot path leaves to FastAPI: `wait=1e0`); the two answers must agree. Returns the hot one."""
    hot = await http.get(f"/jobs/{job_id}" + (f"?wait={wait}" if wait else ""), headers=headers)
    routed = await http.get(f"/jobs/{job_id}?wait={float(wait or 0):g}e0", headers=headers)
    assert (hot.status_code, hot.json()) == (routed.status_code, routed.json()), (hot.text, routed.text)
    for name in ("content-type", "www-authenticate"):
        assert hot.headers.get(name) == routed.headers.get(name), name
    return hot


async def test_job_reads_agree(start_service):
    """`GET /jobs/{id}` is hot (app/http/fastpath/hot.py), with or without `wait`: the same answers as
    FastAPI's, for jobs, unknown jobs, every role and a token limited to other queues."""
    service = start_service(tokens={"a": "admin", "w": "worker", "s": {"role": "viewer", "queues": ["mine"]}})
    admin = {"authorization": "Bearer a"}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        job = (await http.post("/jobs", json={"queue": "q", "payload": [1]}, headers=admin)).json()
        await http.delete(f"/jobs/{job['id']}", headers=admin)  # finished: a wait answers at once
        for wait in (None, "1", "0.5"):
            assert (await read_both_ways(http, job["id"], wait, **admin)).json()["status"] == "cancelled"
            assert (await read_both_ways(http, job["id"], wait, authorization="Bearer w")).status_code == 200
            assert (await read_both_ways(http, job["id"], wait, authorization="Bearer s")).status_code == 404
            assert (await read_both_ways(http, job["id"], wait)).status_code == 401
            assert (await read_both_ways(http, 999999, wait, **admin)).status_code == 404
        for path in ("/jobs/0", "/jobs/-1", "/jobs/99999999999999999999", f"/jobs/{job['id']}?wait=61"):
            r = await http.get(path, headers=admin)  # not the hot path's: FastAPI refuses them
            assert r.status_code == 422, (path, r.text)
