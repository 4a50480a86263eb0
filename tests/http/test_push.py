"""Push delivery (API part 7): a queue with a push target has its jobs POSTed to an endpoint by the service,
signed as Standard Webhooks specifies, and each answer decides its job. The endpoint is a real HTTP
server of the test's own (tests/push_endpoint.py); the service is a real one, over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import orjson
import pytest
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from tests.helpers import assert_problem, enqueue
from tests.push_endpoint import Endpoint
from tests.service_process import ServiceProcess
from tests.waiting import until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def endpoint():
    endpoint = await Endpoint().start()
    yield endpoint
    await endpoint.stop()


@pytest.fixture
async def pushing(start_service, endpoint):
    """A service that may push to the endpoint, with a small result limit; and a client of it."""
    service = start_service(push_allowed_urls=[endpoint.url("/")], max_result_bytes=1024)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        yield client


async def push_to(client: httpx.AsyncClient, queue: str, url: str, **settings: object) -> str:
    """Give the queue its push target (and any other settings); its secret."""
    push = {"url": url, **{k: settings.pop(k) for k in ("timeout", "concurrency") if k in settings}}
    r = await client.patch(f"/queues/{queue}", json={"push": push, **settings})
    assert r.status_code == 200, r.text
    return r.json().get("push_secret")


async def job(client: httpx.AsyncClient, job_id: int) -> dict:
    return (await client.get(f"/jobs/{job_id}")).json()


async def ended(client: httpx.AsyncClient, job_id: int, status: str, timeout: float = 10.0) -> dict:
    async def now() -> dict | None:
        found = await job(client, job_id)
        return found if found["status"] == status else None

    return await until(now, timeout=timeout)


async def given_back(client: httpx.AsyncClient, job_id: int) -> dict:
    """The job once a delivery's answer has put it back pending (its `delivery` says how)."""

    async def now() -> dict | None:
        found = await job(client, job_id)
        return found if found["status"] == "pending" and found["delivery"] else None

    return await until(now)


def json_answer(value: object, status: int = 200) -> object:
    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response(value, status=status)

    return answer


def status_answer(status: int, text: str = "", **headers: str) -> object:
    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=status, text=text, headers=headers)

    return answer


# --- configuration ---------------------------------------------------------------------------------


async def test_push_is_refused_until_the_service_allows_urls(client):
    r = await client.patch("/queues/q", json={"push": {"url": "https://example.com/jobs"}})
    assert "JOBQ_PUSH_ALLOWED_URLS" in assert_problem(r, 422, "validation_error")["detail"]
    assert (await client.get("/queues/q")).status_code == 404  # nothing was made


async def test_a_url_outside_the_allowed_prefixes_is_refused(pushing, endpoint):
    for url in (
        "http://127.0.0.2/x",
        endpoint.url("/").replace("127.0.0.1", "127.0.0.1.evil.example"),
        f"http://user:pw@127.0.0.1:{endpoint.port}/",
        "ftp://127.0.0.1/",
    ):
        r = await pushing.patch("/queues/q", json={"push": {"url": url}})
        assert_problem(r, 422, "validation_error")
    for bad in ({"timeout": 0}, {"timeout": 901}, {"concurrency": 0}, {"concurrency": 1001}):
        r = await pushing.patch("/queues/q", json={"push": {"url": endpoint.url("/"), **bad}})
        assert_problem(r, 422, "validation_error")


async def test_the_secret_is_answered_once_and_never_shown_again(pushing, endpoint, caplog):
    r = await pushing.patch("/queues/q", json={"push": {"url": endpoint.url("/a")}})
    secret = r.json()["push_secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert r.json()["push"] == {"url": endpoint.url("/a"), "timeout": 30.0, "concurrency": 10}
    again = await pushing.patch("/queues/q", json={"push": {"url": endpoint.url("/b"), "concurrency": 3}})
    assert "push_secret" not in again.json()  # the queue keeps its secret
    assert again.json()["push"]["concurrency"] == 3
    seen = [
        (await pushing.get("/queues/q")).text,
        (await pushing.get("/queues")).text,
        (await pushing.get("/metrics")).text,
        (await pushing.get("/ui/queues/q")).text,
    ]
    assert all(secret not in text for text in seen)
    assert secret not in caplog.text
    assert (await pushing.get("/queues/q")).json()["push"]["url"] == endpoint.url("/b")
    # null stops pushing.
    stopped = await pushing.patch("/queues/q", json={"push": None})
    assert stopped.json()["push"] is None


async def test_a_queue_whose_target_is_taken_away_waits_for_workers_again(pushing, endpoint):
    url = endpoint.on("/s", status_answer(204))
    await push_to(pushing, "q", url)
    first = await enqueue(pushing, "q", 1)
    await ended(pushing, first["id"], "completed")
    await pushing.patch("/queues/q", json={"push": None})
    second = await enqueue(pushing, "q", 2)
    await asyncio.sleep(0.5)
    assert len(endpoint.at("/s")) == 1 and (await job(pushing, second["id"]))["status"] == "pending"
    r = await pushing.post("/lease", json={"queue": "q"})
    assert [j["id"] for j in r.json()["jobs"]] == [second["id"]]  # a worker's now
    await push_to(pushing, "q", url)  # and pushed again once given a target again
    third = await enqueue(pushing, "q", 3)
    await ended(pushing, third["id"], "completed")


# --- the request --------------------------------------------------------------------------------------


async def test_a_secret_made_before_the_target_signs_its_first_delivery(pushing, endpoint):
    """Rotating first makes the queue's secret before any delivery: the PATCH that then sets the URL has
    none to answer, and the first request is signed with the secret made first."""
    r = await pushing.post("/queues/early/push/secret")
    assert r.status_code == 200
    secret = r.json()["secret"]
    set_later = await pushing.patch(
        "/queues/early", json={"push": {"url": endpoint.on("/e", status_answer(204))}}
    )
    assert set_later.status_code == 200 and "push_secret" not in set_later.json()
    await enqueue(pushing, "early", 1)
    (got,) = await endpoint.wait_for("/e", 1)
    assert len(got.headers["webhook-signature"].split(" ")) == 1  # no secret before it to sign with
    Webhook(secret).verify(got.body, got.headers)


async def test_a_job_is_posted_signed_and_completed_with_the_answer_as_result(pushing, endpoint):
    url = endpoint.on("/ok", json_answer({"sent": True}))
    secret = await push_to(pushing, "q", url)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    made = await enqueue(pushing, "q", {"to": "ada"}, kind="email", key="k1", traceparent=traceparent)
    (got,) = await endpoint.wait_for("/ok", 1)
    done = await ended(pushing, made["id"], "completed")
    assert done["result"] == {"sent": True}
    assert done["delivery"]["outcome"] == "completed" and done["delivery"]["status"] == 200
    # Signed as Standard Webhooks says, verified by its own library.
    assert Webhook(secret).verify(got.body, got.headers) == got.job
    assert got.headers["webhook-id"] == f"job_{made['id']}"
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
    assert got.headers["jobq-attempt"] == "1"
    assert got.headers["traceparent"] == traceparent
    assert got.headers["Content-Type"] == "application/json"
    body = got.job
    assert {k: body[k] for k in ("id", "queue", "kind", "key", "payload", "attempts", "max_attempts")} == {
        "id": made["id"], "queue": "q", "kind": "email", "key": "k1", "payload": {"to": "ada"},
        "attempts": 1, "max_attempts": 5,
    }  # fmt: skip
    assert body["run_at"].endswith("Z") and body["created_at"].endswith("Z") and "parents" not in body
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 43).verify(got.body, got.headers)


async def test_a_2xx_without_a_json_body_completes_without_a_result(pushing, endpoint):
    empty = endpoint.on("/empty", status_answer(204))
    text = endpoint.on("/text", status_answer(200, "fine, thanks"))
    await push_to(pushing, "e", empty)
    await push_to(pushing, "t", text)
    a, b = await enqueue(pushing, "e", 1), await enqueue(pushing, "t", 1)
    done = await ended(pushing, a["id"], "completed")
    assert done["result"] is None and "note" not in done["delivery"]
    done = await ended(pushing, b["id"], "completed")
    assert done["result"] is None and "not JSON" in done["delivery"]["note"]


async def test_an_answer_over_the_result_limit_completes_without_it_and_says_why(pushing, endpoint):
    big = endpoint.on("/big", json_answer({"blob": "x" * 5000}))  # the limit here is 1,024 bytes

    async def endless(request: web.Request, body: bytes) -> web.StreamResponse:
        answer = web.StreamResponse(status=200, headers={"content-type": "application/json"})
        await answer.prepare(request)
        for _ in range(100_000):  # up to 6.4 GB, unless the service stops reading
            await answer.write(b"[" * 65536)
        return answer

    huge = endpoint.on("/huge", endless)
    await push_to(pushing, "big", big)
    await push_to(pushing, "huge", huge, timeout=20)
    a, b = await enqueue(pushing, "big", 1), await enqueue(pushing, "huge", 1)
    done = await ended(pushing, a["id"], "completed")
    assert done["result"] is None and "over 1024 bytes" in done["delivery"]["note"]
    started = time.monotonic()
    done = await ended(pushing, b["id"], "completed", timeout=20)
    assert time.monotonic() - started < 5  # a bounded read, not the whole answer
    assert "over 1024 bytes" in done["delivery"]["note"]


async def test_a_retry_after_puts_the_job_back_uncounted_and_holds_its_key(pushing, endpoint):
    answers = iter([status_answer(503, **{"Retry-After": "2"})])

    async def first_busy(request: web.Request, body: bytes) -> web.StreamResponse:
        answer = next(answers, None)
        return await (answer or json_answer("ok"))(request, body)

    url = endpoint.on("/busy", first_busy)
    await push_to(pushing, "q", url, concurrency=5)
    first = await enqueue(pushing, "q", 1, key="tenant")
    await endpoint.wait_for("/busy", 1)

    held = await given_back(pushing, first["id"])
    assert held["status"] == "pending" and held["attempts"] == 0  # not counted
    assert held["delivery"]["outcome"] == "retry_later" and held["delivery"]["retry_after"] == 2
    # The key is held: a job of it enqueued now waits too; a job of another key goes at once.
    same = await enqueue(pushing, "q", 2, key="tenant")
    other = await enqueue(pushing, "q", 3, key="other")
    await ended(pushing, other["id"], "completed", timeout=1.5)
    assert (await job(pushing, same["id"]))["status"] == "pending"
    await ended(pushing, first["id"], "completed")
    await ended(pushing, same["id"], "completed")
    calls = endpoint.at("/busy")
    by_job = {}
    for call in calls:
        by_job.setdefault(call.job["id"], []).append(call)
    assert by_job[first["id"]][1].at - by_job[first["id"]][0].at >= 1.9
    assert by_job[same["id"]][0].at - by_job[first["id"]][0].at >= 1.9
    assert by_job[first["id"]][1].headers["jobq-attempt"] == "1"  # the same attempt, again
    assert {c.headers["webhook-id"] for c in by_job[first["id"]]} == {f"job_{first['id']}"}


async def test_a_retry_after_on_a_job_without_a_key_holds_the_whole_queue(pushing, endpoint):
    answers = iter([status_answer(429, **{"Retry-After": "2"})])

    async def first_busy(request: web.Request, body: bytes) -> web.StreamResponse:
        return await (next(answers, None) or json_answer("ok"))(request, body)

    await push_to(pushing, "q", endpoint.on("/busy", first_busy))
    first = await enqueue(pushing, "q", 1)
    (call,) = await endpoint.wait_for("/busy", 1)
    await given_back(pushing, first["id"])  # the answer was taken: the queue is held from now
    keyed = await enqueue(pushing, "q", 2, key="k")
    await asyncio.sleep(1.0)
    assert len(endpoint.at("/busy")) == 1  # nothing of the queue goes while it is held
    await ended(pushing, keyed["id"], "completed")
    await ended(pushing, first["id"], "completed")
    assert min(c.at for c in endpoint.at("/busy")[1:]) - call.at >= 1.9


async def test_failures_count_the_attempt_and_say_what_happened(pushing, endpoint, start_service):
    async def slow(request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    async def drip(request: web.Request, body: bytes) -> web.StreamResponse:
        answer = web.StreamResponse(status=200)
        await answer.prepare(request)
        for _ in range(300):
            await answer.write(b".")
            await asyncio.sleep(0.1)
        return answer

    cases = {
        "e500": (status_answer(500, "database on fire " * 40), "HTTP 500: database on fire"),
        "e404": (status_answer(404), "HTTP 404"),
        "e503": (status_answer(503, "no retry-after"), "HTTP 503: no retry-after"),
        "moved": (status_answer(302, Location="http://elsewhere.example/"), "redirects are not followed"),
        "slow": (slow, "timeout: no full answer within 1 s"),
        "drip": (drip, "timeout: no full answer within 1 s"),
    }
    for name, (answer, _) in cases.items():
        await push_to(pushing, name, endpoint.on(f"/{name}", answer), timeout=1, max_attempts=1)
    # Nothing listens on this port.
    closed = endpoint.url("/").rsplit(":", 1)[0] + ":9/"
    cases["refused"] = (None, "connection failed")
    service = start_service(push_allowed_urls=[endpoint.url("/"), closed])
    async with httpx.AsyncClient(base_url=service.url) as other:
        await push_to(other, "refused", closed, max_attempts=1)
    jobs = {name: (await enqueue(pushing, name, 1))["id"] for name in cases}
    started = time.monotonic()
    for name, (_, error) in cases.items():
        dead = await ended(pushing, jobs[name], "dead")
        assert dead["attempts"] == 1
        assert dead["last_error"].startswith(error) or error in dead["last_error"], (name, dead["last_error"])
        assert dead["delivery"]["outcome"] == "failed" and dead["delivery"]["error"] == dead["last_error"]
    assert len((await job(pushing, jobs["e500"]))["last_error"]) <= 220  # the start of the body
    assert time.monotonic() - started < 8  # a timeout costs its timeout, a drip-feed too
    assert len(endpoint.at("/moved")) == 1  # the redirect was not followed


async def test_a_tls_failure_fails_the_attempt(start_service, tmp_path):
    import ssl
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/", lambda request: web.Response())
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        url = f"https://127.0.0.1:{port}/"
        service = start_service(push_allowed_urls=[url])
        async with httpx.AsyncClient(base_url=service.url) as client:
            await push_to(client, "q", url, max_attempts=1)
            made = await enqueue(client, "q", 1)
            dead = await ended(client, made["id"], "dead")
            assert dead["last_error"].startswith("TLS failed") and "certificate" in dead["last_error"]
    finally:
        await runner.cleanup()


async def test_a_failed_delivery_is_retried_with_backoff_then_dead_then_retried_by_hand(pushing, endpoint):
    answers = iter([status_answer(500, "a"), status_answer(500, "b")])

    async def twice_failing(request: web.Request, body: bytes) -> web.StreamResponse:
        return await (next(answers, None) or json_answer({"n": 1}))(request, body)

    url = endpoint.on("/f", twice_failing)
    await push_to(pushing, "q", url, max_attempts=2, backoff_base=0.5)
    made = await enqueue(pushing, "q", 1)
    dead = await ended(pushing, made["id"], "dead")
    assert dead["attempts"] == 2 and dead["last_error"] == "HTTP 500: b"
    calls = endpoint.at("/f")
    assert calls[1].at - calls[0].at >= 0.5 and calls[1].headers["jobq-attempt"] == "2"
    r = await pushing.post("/dead/retry", json={"ids": [made["id"]]})
    assert r.status_code == 200
    done = await ended(pushing, made["id"], "completed")
    assert done["result"] == {"n": 1} and len(endpoint.at("/f")) == 3


# --- what a worker has applies -------------------------------------------------------------------------


async def test_concurrency_bounds_requests_in_flight_across_replicas(start_service, endpoint):
    async def busy(request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(0.2)
        return web.Response(status=204)

    url = endpoint.on("/c", busy)
    services = [start_service(push_allowed_urls=[endpoint.url("/")]) for _ in range(2)]
    async with httpx.AsyncClient(base_url=services[0].url) as client:
        await push_to(client, "q", url, concurrency=3)
        await client.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(24)]})
        await endpoint.wait_for("/c", 24, timeout=30)
        await until(lambda: _queue_done(client, "q", 24))
    assert endpoint.most_in_flight == 3  # reached, never passed
    workers = {c.headers["webhook-id"] for c in endpoint.at("/c")}
    assert len(workers) == 24  # each job delivered once


async def test_a_replica_that_does_not_allow_a_url_leaves_its_queue_to_the_others(
    start_service, endpoint, caplog
):
    allowing = start_service(push_allowed_urls=[endpoint.url("/")])
    narrower = start_service(push_allowed_urls=["http://127.0.0.1:9/"])
    async with httpx.AsyncClient(base_url=allowing.url) as a, httpx.AsyncClient(base_url=narrower.url) as b:
        await push_to(a, "q", endpoint.on("/n", status_answer(204)))
        made = [(await enqueue(b, "q", i))["id"] for i in range(6)]
        for job_id in made:
            await ended(b, job_id, "completed")
        await b.patch("/queues/other", json={"max_attempts": 3})  # every replica reads the targets again
        await asyncio.sleep(0.3)
    assert len(endpoint.at("/n")) == 6
    said = [r for r in caplog.records if "not delivered by this replica" in r.getMessage()]
    assert len(said) == 1 and "starts with none of JOBQ_PUSH_ALLOWED_URLS" in said[0].getMessage()


async def _queue_done(client: httpx.AsyncClient, queue: str, n: int) -> bool:
    return (await client.get(f"/queues/{queue}")).json()["completed"] == n


async def test_pause_priorities_and_delays_apply(pushing, endpoint):
    url = endpoint.on("/p", json_answer(None))
    await pushing.post("/queues/q/pause")
    await push_to(pushing, "q", url, concurrency=1)
    low = await enqueue(pushing, "q", "low", priority=5)
    high = await enqueue(pushing, "q", "high", priority=-5)
    later = await enqueue(pushing, "q", "later", delay=1.0)
    await asyncio.sleep(0.5)
    assert endpoint.at("/p") == []  # paused
    resumed = time.monotonic()
    await pushing.post("/queues/q/resume")
    calls = await endpoint.wait_for("/p", 3)
    assert [c.job["id"] for c in calls] == [high["id"], low["id"], later["id"]]
    assert calls[0].at - resumed < 0.5  # woken by the resume, not polled
    assert calls[2].at - resumed >= 0.4


async def test_key_concurrency_holds_for_deliveries(pushing, endpoint):
    running: dict[str, int] = {}
    most: dict[str, int] = {}

    async def per_key(request: web.Request, body: bytes) -> web.StreamResponse:
        key = orjson.loads(body)["key"]
        running[key] = running.get(key, 0) + 1
        most[key] = max(most.get(key, 0), running[key])
        await asyncio.sleep(0.05)
        running[key] -= 1
        return web.Response(status=204)

    url = endpoint.on("/k", per_key)
    await push_to(pushing, "q", url, concurrency=10, key_concurrency=1)
    jobs = [{"queue": "q", "payload": i, "key": f"k{i % 3}"} for i in range(12)]
    await pushing.post("/jobs/batch", json={"jobs": jobs})
    calls = await endpoint.wait_for("/k", 12)
    assert most == {"k0": 1, "k1": 1, "k2": 1}
    for key in ("k0", "k1", "k2"):  # and in order
        ids = [c.job["id"] for c in calls if c.job["key"] == key]
        assert ids == sorted(ids)


async def test_fair_turns_hold_for_deliveries(pushing, endpoint):
    """A key's backlog, then a few jobs of another key: with `fair`, each of the few is delivered after
    one of the backlog's, not after all of it."""
    await pushing.patch("/queues/q", json={"fair": True})
    await pushing.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 0, "key": "big"}] * 50})
    await pushing.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 0, "key": "small"}] * 3})
    await push_to(pushing, "q", endpoint.on("/f", status_answer(204)), concurrency=1)
    calls = await endpoint.wait_for("/f", 8)
    keys = [c.job["key"] for c in calls[:8]]
    assert keys.count("small") == 3 and "small, small" not in ", ".join(keys), keys


async def test_a_queue_rate_paces_deliveries(pushing, endpoint):
    await pushing.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(9)]})
    started = time.monotonic()
    await push_to(
        pushing, "q", endpoint.on("/r", status_answer(204)), concurrency=10, rate={"limit": 3, "period": 1}
    )
    await endpoint.wait_for("/r", 3)
    await asyncio.sleep(0.5)
    assert len(endpoint.at("/r")) == 3  # the window's three, however many slots are free
    calls = await endpoint.wait_for("/r", 9, timeout=10)
    assert calls[-1].at - started >= 1.9  # three windows


async def test_a_child_is_pushed_with_its_parents_results(pushing, endpoint):
    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"from": orjson.loads(body)["id"]})

    url = endpoint.on("/w", answer)
    await push_to(pushing, "q", url)
    parent = await enqueue(pushing, "q", "parent")
    child = await enqueue(pushing, "q", "child", depends_on=[parent["id"]])
    calls = await endpoint.wait_for("/w", 2)
    assert [c.job["id"] for c in calls] == [parent["id"], child["id"]]
    (seen,) = calls[1].job["parents"]
    assert seen["id"] == parent["id"] and seen["status"] == "completed"
    assert seen["result"] == {"from": parent["id"]}


async def test_pickup_is_woken_not_polled(pushing, endpoint):
    url = endpoint.on("/fast", status_answer(204))
    await push_to(pushing, "q", url)
    await asyncio.sleep(0.3)  # the pusher is waiting
    gaps = []
    for i in range(5):
        sent = time.monotonic()
        await enqueue(pushing, "q", i)
        calls = await endpoint.wait_for("/fast", i + 1)
        gaps.append(calls[-1].at - sent)
    assert max(gaps) < 1.0  # the safety look is every 5 s


async def test_a_rotated_secret_signs_beside_the_old_one(pushing, endpoint):
    url = endpoint.on("/r", status_answer(204))
    old = await push_to(pushing, "q", url)
    r = await pushing.post("/queues/q/push/secret")
    assert r.status_code == 200
    new = r.json()["secret"]
    assert new != old and new.startswith("whsec_")
    await enqueue(pushing, "q", 1)
    (got,) = await endpoint.wait_for("/r", 1)
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(got.body, got.headers)
    Webhook(new).verify(got.body, got.headers)


async def test_deliveries_are_counted_in_the_metrics(pushing, endpoint):
    await push_to(pushing, "m", endpoint.on("/m", status_answer(204)))
    await push_to(pushing, "x", endpoint.on("/x", status_answer(500)), max_attempts=1)
    a, b = await enqueue(pushing, "m", 1), await enqueue(pushing, "x", 1)
    await ended(pushing, a["id"], "completed")
    await ended(pushing, b["id"], "dead")
    text = (await pushing.get("/metrics")).text
    assert 'jobq_push_deliveries_total{outcome="completed",queue="m"} 1.0' in text
    assert 'jobq_push_deliveries_total{outcome="failed",queue="x"} 1.0' in text
    assert 'jobq_push_delivery_duration_seconds_count{queue="m"} 1.0' in text
    assert 'jobq_push_in_flight{queue="m"} 0.0' in text


# --- stopping and crashing -------------------------------------------------------------------------


async def test_a_graceful_stop_finishes_what_is_answered_in_time_and_gives_back_the_rest(
    start_service, endpoint, db
):
    """Within JOBQ_PUSH_STOP_GRACE a delivery is answered and ends its job; past it, its job goes back
    pending, the attempt not counted, and its `delivery` says so."""
    gone = asyncio.Event()

    async def quick(request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        return web.json_response({"done": True})

    async def hanging(request: web.Request, body: bytes) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone.wait(), 20)
        return web.Response(status=204)

    service = start_service(push_allowed_urls=[endpoint.url("/")], push_stop_grace=1.5)
    async with httpx.AsyncClient(base_url=service.url) as client:
        await push_to(client, "quick", endpoint.on("/quick", quick), timeout=30)
        await push_to(client, "hang", endpoint.on("/hang", hanging), timeout=30)
        answered, hung = await enqueue(client, "quick", 1), await enqueue(client, "hang", 1)
        await endpoint.wait_for("/quick", 1)
        await endpoint.wait_for("/hang", 1)
    stopping = time.monotonic()
    await asyncio.to_thread(service.stop)
    assert time.monotonic() - stopping < 6  # the grace, not the hanging endpoint's 20 s
    gone.set()
    rows = {
        row["id"]: row
        for row in await db.fetch(
            "SELECT id, status::text, attempts, result, delivery FROM jobq.all_jobs WHERE id = any($1)",
            [answered["id"], hung["id"]],
        )
    }
    done, back = rows[answered["id"]], rows[hung["id"]]
    assert done["status"] == "completed" and orjson.loads(done["result"]) == {"done": True}
    assert back["status"] == "pending" and back["attempts"] == 0
    assert orjson.loads(back["delivery"])["outcome"] == "released"
    assert len(endpoint.at("/hang")) == 1


async def test_a_killed_replica_loses_nothing_and_the_redelivery_has_the_same_webhook_id(
    start_service, endpoint, database_url, tmp_path
):
    """kill -9 mid-delivery: the leases expire (timeout + push.LEASE_SLACK), another replica delivers
    the jobs again, each under the `webhook-id` its first delivery had, and each ends once."""
    first_calls: set[str] = set()
    gone = asyncio.Event()

    async def first_hangs(request: web.Request, body: bytes) -> web.StreamResponse:
        webhook_id = request.headers["webhook-id"]
        if webhook_id not in first_calls:
            first_calls.add(webhook_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), 30)
            return web.Response(status=500)
        return web.json_response({"again": webhook_id})

    url = endpoint.on("/k", first_hangs)
    allowed = endpoint.url("/")
    doomed = ServiceProcess(tmp_path, JOBQ_DATABASE_URL=database_url, JOBQ_PUSH_ALLOWED_URLS=allowed)
    try:
        await asyncio.to_thread(doomed.wait_ready)
        async with httpx.AsyncClient(base_url=doomed.url) as client:
            await push_to(client, "q", url, timeout=2)
            made = [(await enqueue(client, "q", i))["id"] for i in range(3)]
            await endpoint.wait_for("/k", 3)
    finally:
        doomed.kill()
    killed = time.monotonic()
    service = start_service(push_allowed_urls=[allowed])
    async with httpx.AsyncClient(base_url=service.url) as client:
        done = [await ended(client, job_id, "completed", timeout=30) for job_id in made]
    gone.set()
    assert [job["result"] for job in done] == [{"again": f"job_{job_id}"} for job_id in made]
    calls = endpoint.at("/k")
    assert len(calls) == 6
    for job_id in made:
        mine = [c for c in calls if c.job["id"] == job_id]
        assert [c.headers["webhook-id"] for c in mine] == [f"job_{job_id}"] * 2
        assert mine[1].at - killed >= 2 - 0.5  # not before the lost lease expired
    assert all(job["attempts"] == 2 for job in done)  # the lost delivery counted as an attempt
