"""The database goes away and comes back: 503 `unavailable` meanwhile, recovery without a restart."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.db import migrations
from app.http.deps import Unready


def _restart(server) -> None:
    with server._lock:
        server.ensure_postgres_running()


def _until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_database_restart_gives_503_then_recovers(own_server, start_service):
    dsn = own_server.get_uri()
    migrations.upgrade(dsn)
    service = start_service(
        database_url=dsn, pool_acquire_timeout=1.0, statement_timeout=2.0, wakeup_safety_interval=60.0
    )
    wakeups = service.app.state.runtime.wakeups
    with httpx.Client(base_url=service.url, timeout=10) as http:
        before = http.post("/jobs", json={"queue": "q", "payload": "before"})
        assert before.status_code == 201

        own_server.stop()
        for call in (
            lambda: http.post("/jobs", json={"queue": "q", "payload": "during"}),
            lambda: http.post("/lease", json={"queue": "q"}),
            lambda: http.post("/lease", json={"queue": "q", "wait": 30}),  # no hanging on a dead database
            lambda: http.get(f"/jobs/{before.json()['id']}"),
            lambda: http.get("/queues"),
        ):
            r = call()
            assert r.status_code == 503, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["code"] == "unavailable"
        ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        Unready.model_validate(ready.json())  # as openapi.json describes the 503
        assert http.get("/healthz").status_code == 200

        _restart(own_server)
        after = _until(
            lambda: (
                (r := http.post("/jobs", json={"queue": "q", "payload": "after"})).status_code == 201 and r
            )
        )
        assert http.get("/readyz").json()["ready"] is True

        leased = http.post("/lease", json={"queue": "q", "max_jobs": 10}).json()["jobs"]
        assert sorted(j["payload"] for j in leased) == ["after", "before"]
        assert {j["id"] for j in leased} == {before.json()["id"], after.json()["id"]}

        # The listener is back too: a long-poll is woken by the next enqueue, not by a poll.
        _until(lambda: wakeups.reconnects >= 1 and wakeups.listening.is_set())
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(http.post, "/lease", json={"queue": "q", "wait": 20})
            time.sleep(0.3)
            started = time.monotonic()
            http.post("/jobs", json={"queue": "q", "payload": "woken"})
            (job,) = waiting.result().json()["jobs"]
        assert job["payload"] == "woken" and time.monotonic() - started < 0.5


@pytest.mark.anyio
async def test_a_transaction_postgresql_rolls_back_is_503_nothing_done():
    """A deadlock victim or a serialization failure (a service statement against a migration's locks,
    say) committed nothing: 503 with `nothing_done`, so that even a nack may be sent again; never 500."""
    import asyncpg
    from starlette.requests import Request

    from app.http import problems

    request = Request({"type": "http", "method": "POST", "path": "/nack", "headers": []})
    for exc in (asyncpg.DeadlockDetectedError("deadlock detected"), asyncpg.SerializationError("x")):
        response = await problems.answer(request, exc)
        body = json.loads(response.body)
        assert (response.status_code, body["code"], body["nothing_done"]) == (503, "unavailable", True)
        assert response.headers["retry-after"] == "1"


@pytest.mark.anyio
async def test_a_server_that_refuses_writes_is_503_nothing_done_and_its_connections_are_dropped(
    database_url, start_service, db
):
    """A failover manager can keep a promoted standby read-only for a moment (pg_auto_failover does, until
    the old primary is surely gone), and a connection then finds the server refusing writes (SQLSTATE
    25006). Every call answers 503 with `nothing_done`, never 500; the service drops such a connection (a
    new one goes to the host that takes writes), so it serves again by itself once writes are taken."""
    from tests.fixtures import POOLER
    from tests.waiting import until

    service = start_service(pool_acquire_timeout=2.0)
    database = await db.fetchval("SELECT current_database()")
    app_backends = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        job = (await client.post("/jobs", json={"queue": "q", "payload": 1})).json()
        (leased,) = (await client.post("/lease", json={"queue": "q"})).json()["jobs"]
        await db.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        await db.execute(app_backends)  # the sessions a failover ends; the service's next ones refuse writes

        async def refused() -> bool:
            r = await client.post("/jobs", json={"queue": "q", "payload": 2})
            assert r.status_code == 503, r.text
            return "takes no writes" in r.json()["detail"]

        await until(refused, timeout=20)
        calls = [
            lambda: client.post("/jobs", json={"queue": "q", "payload": 3}),
            lambda: client.post("/jobs/batch", json={"jobs": [{"queue": "q", "payload": 4}]}),
            lambda: client.post("/lease", json={"queue": "q", "wait": 2}),
            lambda: client.post("/ack", json={"id": job["id"], "lease_token": leased["lease_token"]}),
            lambda: client.post("/nack", json={"id": job["id"], "lease_token": leased["lease_token"]}),
        ]
        for call in calls * 3:
            r = await call()
            assert r.status_code == 503, r.text
            body = r.json()
            assert (body["code"], r.headers["retry-after"]) == ("unavailable", "1")
            if "takes no writes" in body["detail"]:
                assert body["nothing_done"] is True

        await db.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        if POOLER:
            # PgBouncer keeps its server sessions, read-only ones too: they are its to replace.
            await db.execute(app_backends)

        async def served() -> bool:
            r = await client.post("/ack", json={"id": job["id"], "lease_token": leased["lease_token"]})
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200

        await until(served, timeout=20)
    rows = await db.fetch("SELECT payload::text, status FROM jobq.all_jobs")
    assert [tuple(r) for r in rows] == [("1", "completed")], "nothing refused was written"
