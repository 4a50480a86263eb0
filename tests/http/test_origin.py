"""Requests a browser was made to send by a page of another site (cross-site request forgery), and
requests naming a host this service is not (DNS rebinding): refused by app/http/middleware/origin.py before
any route runs, over HTTP against a live service, every effect checked in the database."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import httpx
import pytest

from app.settings import Settings
from tests.helpers import assert_problem, count, enqueue
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.anyio

# What a plain <form method="post"> on another site makes a browser send: no preflight, no JSON.
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
# The ways a browser says a request comes from elsewhere: a current browser's Sec-Fetch-Site (a
# sibling subdomain is `same-site`, still another origin), and an older browser's Origin alone
# (`null` from a sandboxed frame or a redirect).
FROM_ELSEWHERE = (
    {"Origin": "http://evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "null"},
    {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
)
SQS_CREATE = {
    "Content-Type": "application/x-amz-json-1.0",
    "X-Amz-Target": "AmazonSQS.CreateQueue",
}


async def paused(db, queue: str = "q") -> bool | None:
    return await db.fetchval("SELECT paused FROM jobq.queues WHERE name = $1", queue)


# --- cross-site requests --------------------------------------------------------------------------


async def test_a_form_on_another_site_cannot_pause_a_queue(client, db):
    await enqueue(client)
    for headers in FROM_ELSEWHERE:
        for action in ("pause", "resume"):
            r = await client.post(f"/queues/q/{action}", headers={**FORM, **headers}, content=b"")
            body = assert_problem(r, 403, "forbidden")
            assert "JOBQ_TRUSTED_ORIGINS" in body["detail"], body
    assert await paused(db) is False
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 1


async def test_the_same_origin_and_callers_that_are_not_browsers_may(client, service, db):
    await enqueue(client)
    origin = service.url  # http://127.0.0.1:<port>, as the browser's address bar shows it
    # A current browser on a page of this service; an older one that sends only Origin; a request
    # the user made directly (a bookmark: Sec-Fetch-Site none); curl, SDKs and workers (neither header).
    for headers, expected in (
        ({"Origin": origin, "Sec-Fetch-Site": "same-origin"}, True),
        ({"Origin": origin}, False),
        ({"Sec-Fetch-Site": "none"}, True),
        ({}, False),
    ):
        action = "pause" if expected else "resume"
        r = await client.post(f"/queues/q/{action}", headers={**FORM, **headers}, content=b"")
        assert r.status_code == 200, (headers, r.text)
        assert await paused(db) is expected, headers


async def test_a_cross_site_enqueue_stores_nothing(client, db):
    body = json.dumps({"queue": "q", "payload": {"n": 1}})
    batch = json.dumps({"jobs": [{"queue": "q", "payload": {"n": 1}}]})
    # text/plain is what a form (enctype="text/plain") or a no-cors fetch can send without a preflight;
    # application/json comes from a page that got past a preflight, so it is refused the same way.
    for content_type in ("text/plain", "application/json"):
        for path, content in (("/jobs", body), ("/jobs/batch", batch)):
            for headers in FROM_ELSEWHERE:
                r = await client.post(
                    path, content=content, headers={"Content-Type": content_type, **headers}
                )
                assert_problem(r, 403, "forbidden")
    assert await count(db) == 0


async def test_every_state_changing_route_is_covered(client, db):
    """Hot routes (answered before FastAPI's routing), DELETE and PATCH included."""
    job_id = (await enqueue(client))["id"]
    evil = {"Origin": "http://evil.example", "Content-Type": "application/json"}
    for method, path, body in (
        ("POST", "/lease", {"queue": "q"}),
        ("DELETE", f"/jobs/{job_id}", None),
        ("PATCH", "/queues/q", {"max_attempts": 1}),
        ("POST", "/dead/retry", {"queue": "q"}),
        ("PUT", "/jobs", {"queue": "q"}),  # no such route: refused all the same, before routing
    ):
        content = None if body is None else json.dumps(body)
        r = await client.request(method, path, content=content, headers=evil)
        assert_problem(r, 403, "forbidden")
    row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs WHERE id = $1", job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert await db.fetchval("SELECT max_attempts FROM jobq.queues WHERE name = 'q'") == 5
    # Reading is not refused: a cross-site page cannot read the answer anyway (no CORS headers).
    r = await client.get(f"/jobs/{job_id}", headers=evil)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_the_sqs_api_refuses_a_cross_site_post(client, db):
    for headers in FROM_ELSEWHERE:
        r = await client.post("/", content=b'{"QueueName": "evil"}', headers={**SQS_CREATE, **headers})
        assert 400 <= r.status_code < 500, r.text
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0
    r = await client.post("/", content=b'{"QueueName": "fine"}', headers=SQS_CREATE)  # an SDK's request
    assert r.status_code == 200, r.text
    assert await db.fetchval("SELECT array_agg(name) FROM jobq.queues") == ["fine"]


async def test_trusted_origins_may_post_from_another_origin(start_service, database_url):
    import asyncpg

    service = start_service(trusted_origins=["https://ops.example.com"])
    async with httpx.AsyncClient(base_url=service.url) as client:
        await enqueue(client)
        trusted = {"Origin": "https://ops.example.com", "Sec-Fetch-Site": "cross-site"}
        r = await client.post("/queues/q/pause", headers={**FORM, **trusted})
        assert r.status_code == 200, r.text
        for origin in ("http://ops.example.com", "https://ops.example.com:8443", "https://evil.example"):
            r = await client.post("/queues/q/resume", headers={**FORM, "Origin": origin})
            assert_problem(r, 403, "forbidden")
    conn = await asyncpg.connect(database_url)
    try:
        assert await paused(conn) is True
    finally:
        await conn.close()


# --- the Host header -------------------------------------------------------------------------------


async def test_a_loopback_service_refuses_other_host_names(client, service, db):
    port = urlsplit(service.url).port
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "localhost.evil"):
        for method, path, body in (
            ("GET", "/queues", None),
            ("GET", "/jobs/1", None),
            ("GET", "/ui", None),
            ("POST", "/jobs", {"queue": "q", "payload": 1}),
            ("POST", "/lease", {"queue": "q"}),
        ):
            r = await client.request(method, path, json=body, headers={"Host": host})
            problem = assert_problem(r, 400, "disallowed_host")
            assert "JOBQ_ALLOWED_HOSTS" in problem["detail"], problem
        r = await client.post("/", content=b'{"QueueName": "evil"}', headers={**SQS_CREATE, "Host": host})
        assert 400 <= r.status_code < 500
    assert await count(db) == 0
    assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0
    # The loopback names, with and without a port, in any case.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost", f"[::1]:{port}", "localhost."):
        r = await client.get("/queues", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)


async def test_health_probes_answer_whatever_host_they_name(client):
    for path in ("/healthz", "/readyz"):
        r = await client.get(path, headers={"Host": "10.1.2.3:8000"})
        assert r.status_code == 200, r.text


async def test_any_host_when_allowed_hosts_is_a_star(start_service, database_url):
    service = start_service(allowed_hosts=["*"])
    async with httpx.AsyncClient(base_url=service.url, headers={"Host": "attacker.example"}) as client:
        assert (await client.get("/queues")).status_code == 200
        r = await client.post("/jobs", json={"queue": "q", "payload": 1})
        assert r.status_code == 201, r.text
        # The SQS API's queue URLs name the host the request came to.
        r = await client.post("/", content=b'{"QueueName": "s"}', headers=SQS_CREATE)
        assert r.json()["QueueUrl"].startswith("http://attacker.example/"), r.text


async def test_any_host_by_default_when_bound_beyond_loopback(start_service):
    service = start_service(host="0.0.0.0")
    async with httpx.AsyncClient(base_url=service.url) as client:
        r = await client.get("/queues", headers={"Host": "jobq.internal:8000"})
        assert r.status_code == 200, r.text


async def test_named_hosts_and_subdomains(start_service):
    service = start_service(allowed_hosts=["jobq.internal", ".example.com", "[fd00::1]"])
    async with httpx.AsyncClient(base_url=service.url) as client:
        for host, allowed in (
            ("jobq.internal:8000", True),
            ("example.com", True),
            ("api.example.com:443", True),
            ("[fd00::1]:8000", True),
            ("notexample.com", False),
            ("jobq.internal.evil", False),
            ("127.0.0.1", False),  # a list replaces the loopback names, as Django's ALLOWED_HOSTS does
        ):
            r = await client.get("/queues", headers={"Host": host})
            assert r.status_code == (200 if allowed else 400), (host, r.text)


async def test_a_request_without_a_host_header_is_not_a_browsers(service):
    """HTTP/1.0 allows it; a browser never omits it, so it cannot be a rebinding page's."""
    address = urlsplit(service.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(b"GET /queues HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_allowed_hosts_from_the_environment(monkeypatch):
    monkeypatch.setenv("JOBQ_ALLOWED_HOSTS", "jobq.internal, .example.com")
    assert Settings().allowed_hosts == ["jobq.internal", ".example.com"]
    monkeypatch.setenv("JOBQ_ALLOWED_HOSTS", '["jobq.internal", "*"]')
    assert Settings().allowed_hosts == ["jobq.internal", "*"]
    monkeypatch.setenv("JOBQ_TRUSTED_ORIGINS", "https://Ops.example.com/, http://localhost:3000")
    assert Settings().trusted_origins == ["https://ops.example.com", "http://localhost:3000"]
    for wrong in ("ops.example.com", "https://ops.example.com/app"):
        monkeypatch.setenv("JOBQ_TRUSTED_ORIGINS", wrong)
        with pytest.raises(ValueError, match="not an origin"):
            Settings()


@pytest.mark.slow
def test_serve_host_decides_the_default(fresh_database, tmp_path):
    """`jobq serve --host` (not only JOBQ_HOST) is the binding address the default follows."""
    dsn = fresh_database()
    for args, expected in (((), 400), (("--host", "0.0.0.0", "--insecure"), 200)):
        service = ServiceProcess(tmp_path, *args, JOBQ_DATABASE_URL=dsn)
        try:
            service.wait_ready()
            r = httpx.get(f"{service.url}/queues", headers={"Host": "jobq.internal"})
            assert r.status_code == expected, (args, r.text)
        finally:
            service.stop()
