"""Long-polls woken through LISTEN/NOTIFY: every path that makes a job ready wakes a waiter at once."""

import asyncio
import json
import time

import httpx
import pytest

from app.db.sql import CHANNEL
from app.service.wakeups import Wakeups
from tests.helpers import assert_problem
from tests.waiting import until

pytestmark = pytest.mark.anyio

# With the safety poll a minute away, only a wake-up can answer a waiter within these tests' bounds.
QUIET = {"wakeup_safety_interval": 60.0}


@pytest.fixture
def quiet_service(start_service):
    return start_service(**QUIET)


@pytest.fixture
async def http(quiet_service):
    async with httpx.AsyncClient(base_url=quiet_service.url, timeout=30) as client:
        yield client


async def _lease_after(http, trigger, *, queue="q", wait=10.0, **body):
    """Start a long-poll, run `trigger` once it is waiting, and return (jobs, seconds after trigger)."""
    lease = asyncio.create_task(http.post("/lease", json={"queue": queue, "wait": wait, **body}))
    await asyncio.sleep(0.3)
    assert not lease.done(), "the long-poll answered before anything was ready"
    await trigger()
    triggered = time.monotonic()
    r = await lease
    assert r.status_code == 200, r.text
    return r.json()["jobs"], time.monotonic() - triggered


async def test_http_enqueue_wakes_a_waiter(http):
    jobs, latency = await _lease_after(http, lambda: http.post("/jobs", json={"queue": "q", "payload": 1}))
    assert [j["payload"] for j in jobs] == [1]
    assert latency < 0.2


async def test_run_now_wakes_a_waiter(http):
    """A scheduled job run now (POST /jobs/{id}/run) is handed to a waiting long-poll at once."""
    job = (await http.post("/jobs", json={"queue": "q", "payload": 3, "delay": 3600})).json()
    jobs, latency = await _lease_after(http, lambda: http.post(f"/jobs/{job['id']}/run"))
    assert [j["id"] for j in jobs] == [job["id"]]
    assert latency < 0.2


async def test_sql_enqueue_wakes_a_waiter_at_commit(http, db):
    async def enqueue():
        async with db.transaction():
            await db.execute("SELECT jobq.enqueue('q', '2')")
            await asyncio.sleep(0.3)  # not before the commit

    jobs, latency = await _lease_after(http, enqueue)
    assert [j["payload"] for j in jobs] == [2]
    assert latency < 0.2


async def test_delayed_job_wakes_its_waiter_when_due(http):
    jobs, latency = await _lease_after(
        http, lambda: http.post("/jobs", json={"queue": "q", "payload": 3, "delay": 1.0})
    )
    assert [j["payload"] for j in jobs] == [3]
    assert 0.9 <= latency < 1.3


async def test_nack_retry_wakes_a_waiter_when_due(http):
    await http.post("/jobs", json={"queue": "q", "payload": 4})
    (job,) = (await http.post("/lease", json={"queue": "q"})).json()["jobs"]
    nack = {"id": job["id"], "lease_token": job["lease_token"], "retry_after": 0.5}
    jobs, latency = await _lease_after(http, lambda: http.post("/nack", json=nack))
    assert [j["id"] for j in jobs] == [job["id"]]
    assert 0.4 <= latency < 0.8


async def test_dead_retry_and_resume_wake_waiters(http):
    await http.post("/jobs", json={"queue": "q", "payload": 5, "max_attempts": 1})
    (job,) = (await http.post("/lease", json={"queue": "q"})).json()["jobs"]
    await http.post("/nack", json={"id": job["id"], "lease_token": job["lease_token"]})
    jobs, latency = await _lease_after(http, lambda: http.post("/dead/retry", json={"ids": [job["id"]]}))
    assert [j["id"] for j in jobs] == [job["id"]] and latency < 0.2

    await http.post("/queues/q/pause")
    await http.post("/jobs", json={"queue": "q", "payload": 6})
    jobs, latency = await _lease_after(http, lambda: http.post("/queues/q/resume"))
    assert [j["payload"] for j in jobs] == [6] and latency < 0.2


async def test_expired_lease_wakes_a_waiter(http):
    await http.post("/jobs", json={"queue": "q", "payload": 7})
    (job,) = (await http.post("/lease", json={"queue": "q", "visibility_timeout": 1})).json()["jobs"]
    started = time.monotonic()
    r = await http.post("/lease", json={"queue": "q", "wait": 10})
    (again,) = r.json()["jobs"]
    assert again["id"] == job["id"] and again["attempts"] == 2
    assert time.monotonic() - started < 1.6  # 1 s lease + 0.2 s of expiry interval + the wake-up


async def test_one_job_wakes_one_waiter_not_all(quiet_service, http):
    wakeups = quiet_service.app.state.runtime.wakeups
    waiters = [asyncio.create_task(http.post("/lease", json={"queue": "q", "wait": 3})) for _ in range(20)]
    await asyncio.sleep(0.5)
    assert wakeups.waiter_count() == 20
    before = wakeups.wakes
    await http.post("/jobs", json={"queue": "q", "payload": "only one"})
    done, _ = await asyncio.wait(waiters, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
    assert [len(t.result().json()["jobs"]) for t in done] == [1], "no waiter got the job at once"
    results = await asyncio.gather(*waiters)
    assert sum(len(r.json()["jobs"]) for r in results) == 1
    # One waiter woken for one job (a second only if the first passed its wake-up on).
    assert wakeups.wakes - before <= 2


async def test_a_batch_wakes_as_many_waiters_as_jobs(quiet_service, http):
    waiters = [asyncio.create_task(http.post("/lease", json={"queue": "q", "wait": 5})) for _ in range(10)]
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await http.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": i} for i in range(10)]})
    results = await asyncio.gather(*waiters)
    assert time.monotonic() - started < 1.0
    assert sorted(r.json()["jobs"][0]["payload"] for r in results) == list(range(10))


async def test_client_gone_during_long_poll_strands_nothing(http, quiet_service, db):
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/lease", json={"queue": "q", "wait": 10}, timeout=0.5)
    await asyncio.sleep(0.2)
    await http.post("/jobs", json={"queue": "q", "payload": "for someone still there"})
    await asyncio.sleep(0.5)
    row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs")
    assert (row["status"], row["attempts"]) == ("pending", 0)
    (job,) = (await http.post("/lease", json={"queue": "q"})).json()["jobs"]
    assert job["attempts"] == 1


async def test_listener_reconnects_and_catches_up(quiet_service, http, db):
    wakeups = quiet_service.app.state.runtime.wakeups
    terminated = await db.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'jobq-listener' AND datname = current_database()"
    )
    assert terminated == 1
    deadline = time.monotonic() + 10
    while wakeups.reconnects < 1 or not wakeups.listening.is_set():
        assert time.monotonic() < deadline, "the listener did not reconnect"
        await asyncio.sleep(0.05)
    jobs, latency = await _lease_after(http, lambda: http.post("/jobs", json={"queue": "q", "payload": 8}))
    assert [j["payload"] for j in jobs] == [8] and latency < 0.2


async def test_a_thousand_waiting_long_polls_hold_no_connections(quiet_service, db):
    """1,000 concurrent long-polls in one process: the pool stays within its bound."""
    host, port = quiet_service.url.removeprefix("http://").split(":")
    body = b'{"queue": "idle", "wait": 8}'
    request = (
        b"POST /lease HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    streams = []
    for _ in range(1000):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        streams.append((reader, writer))
    wakeups = quiet_service.app.state.runtime.wakeups
    deadline = time.monotonic() + 10
    while wakeups.waiter_count() < 1000:
        assert time.monotonic() < deadline, f"only {wakeups.waiter_count()} waiting"
        await asyncio.sleep(0.05)
    connections = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'jobq%'"
    )
    assert connections <= quiet_service.settings.pool_max_size + 1  # the pool, and the one listener
    for _, writer in streams:
        writer.close()


# --- long-polls whose clients leave, and the cap on waiting long-polls ------------------------------------


async def _long_poll(service, body: dict, *, path: str = "/lease", headers: dict | None = None):
    """Send a long-poll on a connection of its own and leave it waiting; the writer closes it."""
    host, port = service.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = {"Host": f"{host}:{port}", "Content-Length": str(len(data)), **(headers or {})}
    request = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(request.encode() + data)
    await writer.drain()
    return writer


async def _hang_up(writers) -> None:
    """Close the connections for real: the service sees each client go."""
    for writer in writers:
        writer.close()
        await writer.wait_closed()


# A long-poll with `Content-Type: application/json` is answered by app/http/fastpath/hot.py; one with another
# JSON type goes through FastAPI's routing. Both call the same endpoint, and both must notice the client
# going.
ROUTES = {
    "hot": {"Content-Type": "application/json"},
    "routed": {"Content-Type": "application/vnd.jobq+json"},
}


@pytest.mark.parametrize("route", ROUTES)
async def test_a_wake_up_reaches_the_live_waiter_behind_clients_that_left(quiet_service, http, route):
    """Long-polls whose clients hung up are dropped at once, so the one wake-up of one job goes to the
    long-poll still listening, not to a departed one (the safety poll is a minute away)."""
    wakeups = quiet_service.app.state.runtime.wakeups
    poll = {"queue": "q", "wait": 30}
    gone = [await _long_poll(quiet_service, poll, headers=ROUTES[route]) for _ in range(3)]
    await until(lambda: wakeups.waiter_count() == 3)
    await _hang_up(gone)
    await until(lambda: wakeups.waiter_count() == 0, timeout=5)

    live = asyncio.create_task(http.post("/lease", json={"queue": "q", "wait": 30}))
    await until(lambda: wakeups.waiter_count() == 1)
    await http.post("/jobs", json={"queue": "q", "payload": "for the one still there"})
    r = await asyncio.wait_for(live, timeout=3)  # a wake-up, not the safety poll, answered it
    assert [j["payload"] for j in r.json()["jobs"]] == ["for the one still there"]
    assert wakeups.waiter_count() == 0


def _sqs(action: str) -> dict:
    """The headers of an SQS API call (the service has no credentials configured: none are checked)."""
    return {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}


async def _sqs_queue(http, name: str) -> str:
    r = await http.post("/", headers=_sqs("CreateQueue"), content=json.dumps({"QueueName": name}))
    assert r.status_code == 200, r.text
    return r.json()["QueueUrl"]


async def test_sqs_receive_whose_client_left_is_dropped(quiet_service, http, db):
    """ReceiveMessage long-polls through the same lease: a departed one is dropped, a live one served."""
    receive = {"QueueUrl": await _sqs_queue(http, "s"), "WaitTimeSeconds": 20}
    headers = _sqs("ReceiveMessage")
    wakeups = quiet_service.app.state.runtime.wakeups
    gone = [await _long_poll(quiet_service, receive, path="/", headers=headers) for _ in range(2)]
    await until(lambda: wakeups.waiter_count() == 2)
    await _hang_up(gone)
    await until(lambda: wakeups.waiter_count() == 0, timeout=5)

    live = asyncio.create_task(http.post("/", headers=headers, content=json.dumps(receive)))
    await until(lambda: wakeups.waiter_count() == 1)
    await http.post("/jobs", json={"queue": "s", "payload": "hello"})
    r = await asyncio.wait_for(live, timeout=3)
    assert [m["Body"] for m in r.json()["Messages"]] == ["hello"]
    assert await db.fetchval("SELECT attempts FROM jobq.all_jobs") == 1


async def test_a_wake_up_not_acted_on_is_passed_on(database_url, db):
    """A waiter woken that leaves without looking for jobs (its client went, the service is closing)
    hands its wake-up to the next waiter of the queue: one ready job is never left to the safety poll."""
    wakeups = Wakeups(database_url, safety_interval=60.0)
    await wakeups.start()
    try:
        first, second = wakeups.waiting("q"), wakeups.waiting("q")
        oldest, next_one = first.__enter__(), second.__enter__()
        await db.execute("SELECT pg_notify($1, $2)", CHANNEL, json.dumps({"queue": "q", "n": 1, "run_at": 0}))
        await oldest.wait(5)
        assert oldest.woken and not next_one.woken  # oldest first
        first.__exit__(None, None, None)  # gone without looking
        assert next_one.woken
        second.__exit__(None, None, None)
        assert wakeups.waiter_count() == 0
    finally:
        await wakeups.close()


async def test_long_polls_past_the_cap_are_503_and_short_leases_still_work(start_service):
    service = start_service(max_waiters=3, **QUIET)
    wakeups = service.app.state.runtime.wakeups
    # The three hold their places on a queue of their own: no job below is theirs to take.
    poll = {"queue": "idle", "wait": 30}
    waiting = [await _long_poll(service, poll, headers=ROUTES["hot"]) for _ in range(3)]
    await until(lambda: wakeups.waiter_count() == 3)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        for headers in ROUTES.values():  # hot and routed alike
            r = await http.post("/lease", content=json.dumps({"queue": "other", "wait": 1}), headers=headers)
            problem = assert_problem(r, 503, "unavailable")
            assert int(r.headers["Retry-After"]) >= 1
            assert "JOBQ_MAX_WAITERS" in problem["detail"] and "retry" in problem["detail"]
            assert problem["nothing_done"] is True
        receive = {"QueueUrl": await _sqs_queue(http, "s"), "WaitTimeSeconds": 1}
        r = await http.post("/", headers=_sqs("ReceiveMessage"), content=json.dumps(receive))
        assert r.status_code == 503 and r.json()["__type"].endswith("#ServiceUnavailable"), r.text
        await http.post("/jobs", json={"queue": "other", "payload": "short"})
        r = await http.post("/lease", json={"queue": "other"})  # wait 0: no waiting, no cap
        assert [j["payload"] for j in r.json()["jobs"]] == ["short"]

        await _hang_up(waiting[:1])
        await until(lambda: wakeups.waiter_count() == 2)
        again = asyncio.create_task(http.post("/lease", json={"queue": "other", "wait": 30}))
        await until(lambda: wakeups.waiter_count() == 3)
        await http.post("/jobs", json={"queue": "other", "payload": "accepted"})
        r = await asyncio.wait_for(again, timeout=3)
        assert [j["payload"] for j in r.json()["jobs"]] == ["accepted"]
    await _hang_up(waiting[1:])
