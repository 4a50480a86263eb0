"""GET /metrics: per-queue job counters, database gauges refreshed in the background, latency histograms
(app/telemetry/metrics.py), against a live service and its database."""

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.telemetry.metrics import DatabaseHealth
from app.ui import pages
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset], float]:
    """Every sample of GET /metrics: {(name, labels): value}."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
    out = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def counts(samples: dict, queue: str) -> dict[str, float | None]:
    kinds = ("enqueued", "leased", "acked", "nacked", "dead_lettered", "expired")
    return {k: value(samples, f"jobq_jobs_{k}_total", queue=queue) for k in kinds}


async def post(client, path: str, body: dict, status: int = 200) -> dict:
    r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


async def test_counters_count_jobs_per_queue(client):
    """3 jobs enqueued in `a` (a batch of 2 and a single; a duplicate does not count), 3 leased, 2 acked
    (one alone, one in a batch), 1 nacked dead: the counters of `a` read 3, 3, 2, 1, 1; `b` has its own."""
    await post(client, "/jobs/batch", {"jobs": [{"queue": "a", "payload": i} for i in (1, 2)]}, 201)
    await post(client, "/jobs", {"queue": "a", "payload": 3, "dedup_key": "k"}, 201)
    dup = await post(client, "/jobs", {"queue": "a", "payload": 3, "dedup_key": "k"}, 200)
    assert dup["duplicate"] is True
    await post(client, "/jobs", {"queue": "b", "payload": None}, 201)

    leased = (await post(client, "/lease", {"queue": "a", "max_jobs": 3}))["jobs"]
    assert len(leased) == 3
    first, second, third = ({"id": j["id"], "lease_token": j["lease_token"]} for j in leased)
    assert await post(client, "/ack", first) == {"id": first["id"], "status": "completed"}
    # The batch answers are as before: no queue in them.
    assert await post(client, "/ack/batch", {"items": [second]}) == {
        "results": [{"id": second["id"], "ok": True}]
    }
    nacked = await post(client, "/nack/batch", {"items": [{**third, "dead": True, "error": "no"}]})
    assert nacked["results"][0].keys() == {"id", "ok", "status", "run_at"}
    assert nacked["results"][0]["status"] == "dead"
    # A repeated ack (already completed) and a lost lease change nothing, and count nothing.
    await post(client, "/ack", first)
    await post(client, "/ack/batch", {"items": [third]})

    samples = await scrape(client)
    assert counts(samples, "a") == {
        "enqueued": 3,
        "leased": 3,
        "acked": 2,
        "nacked": 1,
        "dead_lettered": 1,
        "expired": None,
    }
    assert counts(samples, "b") == {
        "enqueued": 1,
        "leased": None,
        "acked": None,
        "nacked": None,
        "dead_lettered": None,
        "expired": None,
    }
    # One claim statement ran on `a`, and was timed.
    assert value(samples, "jobq_claim_duration_seconds_count", queue="a") == 1
    assert value(samples, "jobq_claim_duration_seconds_sum", queue="a") > 0


async def test_expired_leases_are_counted(start_service, db):
    """Two leases expire; the one on its last attempt goes dead: expired 2, dead-lettered 1."""
    service = start_service(expire_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as client:
        await post(client, "/jobs", {"queue": "x", "payload": 1, "max_attempts": 1}, 201)
        await post(client, "/jobs", {"queue": "x", "payload": 2, "max_attempts": 3}, 201)
        leased = await post(client, "/lease", {"queue": "x", "max_jobs": 2, "visibility_timeout": 0.2})
        assert len(leased["jobs"]) == 2

        async def swept() -> bool:
            n = await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'running'")
            return n == 0

        await until(swept)
        assert dict(await db.fetch("SELECT status, count(*) FROM jobq.all_jobs GROUP BY 1")) == {
            "dead": 1,
            "pending": 1,
        }

        # The expiry commits before the service that ran it has counted it: the counters follow an
        # instant later.
        async def counted() -> bool:
            return value(await scrape(client), "jobq_jobs_expired_total", queue="x") == 2

        await until(counted)
        samples = await scrape(client)
        assert value(samples, "jobq_jobs_expired_total", queue="x") == 2
        assert value(samples, "jobq_jobs_dead_lettered_total", queue="x") == 1


async def database_gauges(db, queue: str) -> dict[str, float]:
    """The truth, straight from the table."""
    row = await db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
               count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'dead') AS dead
        FROM jobq.all_jobs WHERE queue = $1
        """,
        queue,
    )
    return dict(row)


def scraped_gauges(samples: dict, queue: str) -> dict[str, float | None]:
    states = ("pending", "scheduled", "running", "dead")
    return {s: value(samples, "jobq_queue_jobs", queue=queue, state=s) for s in states}


async def test_gauges_follow_the_database(start_service, db):
    """Depth per state, lag and paused, as the database has them after a refresh."""
    service = start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as client:
        an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        jobs = [
            {"queue": "g", "payload": 1, "run_at": an_hour_ago},  # waiting for an hour: the lag
            {"queue": "g", "payload": 2},
            {"queue": "g", "payload": 3},
            {"queue": "g", "payload": 4, "delay": 3600},  # scheduled
        ]
        await post(client, "/jobs/batch", {"jobs": jobs}, 201)
        (held,) = (await post(client, "/lease", {"queue": "g", "max_jobs": 1}))["jobs"]
        assert held["payload"] == 1
        await post(client, "/jobs", {"queue": "g", "payload": 5, "max_attempts": 1, "priority": -1}, 201)
        (doomed,) = (await post(client, "/lease", {"queue": "g"}))["jobs"]
        await post(client, "/nack", {"id": doomed["id"], "lease_token": doomed["lease_token"], "error": "x"})
        await post(client, "/queues/p/pause", {})
        truth = await database_gauges(db, "g")
        assert truth == {"pending": 2, "scheduled": 1, "running": 1, "dead": 1}

        async def refreshed() -> dict | None:
            # A refresh taken between the nack and the pause already matches `g`: wait for one after both.
            samples = await scrape(client)
            paused = value(samples, "jobq_queue_paused", queue="p") == 1
            return samples if paused and scraped_gauges(samples, "g") == truth else None

        samples = await until(refreshed)
        # The oldest ready job was enqueued (and ready) moments ago; the one that waited an hour is running.
        assert 0 < value(samples, "jobq_queue_lag_seconds", queue="g") < 600
        assert value(samples, "jobq_queue_paused", queue="g") == 0
        assert scraped_gauges(samples, "p") == {"pending": 0, "scheduled": 0, "running": 0, "dead": 0}

        # A job an hour late makes an hour of lag.
        await post(client, "/jobs", {"queue": "g", "payload": 6, "run_at": an_hour_ago}, 201)

        async def lagging() -> bool:
            return value(await scrape(client), "jobq_queue_lag_seconds", queue="g") >= 3600

        await until(lagging)


async def test_jobs_held_back_by_each_limit(start_service):
    service = start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as client:
        settings = {"key_concurrency": 1, "key_rate": {"limit": 2, "period": 600}}
        r = await client.patch("/queues/held", json=settings)
        assert r.status_code == 200, r.text
        jobs = [{"queue": "held", "payload": n, "key": key} for n, key in enumerate("aaabbbcc")]
        await post(client, "/jobs/batch", {"jobs": jobs}, 201)
        leased = (await post(client, "/lease", {"queue": "held", "max_jobs": 10}))["jobs"]
        assert sorted(j["key"] for j in leased) == ["a", "b", "c"]
        # Each key runs one: a, b and c are at their concurrency, with 2 + 2 + 1 ready jobs behind them.
        for job in leased:
            if job["key"] == "c":
                await post(client, "/ack", {"id": job["id"], "lease_token": job["lease_token"]})
        (again,) = (await post(client, "/lease", {"queue": "held", "max_jobs": 10}))["jobs"]
        assert again["key"] == "c"  # c's second lease: its rate window (2 per 10 minutes) is full

        async def held() -> dict | None:
            samples = await scrape(client)
            got = {limit: value(samples, "jobq_queue_held_jobs", queue="held", limit=limit) for limit in
                   ("concurrency", "key_rate", "rate")}  # fmt: skip
            return got if got == {"concurrency": 4, "key_rate": 0, "rate": 0} else None

        await until(held)


async def test_gauges_are_read_in_the_background_not_per_scrape(start_service):
    """With a long interval, scrapes report the snapshot taken at start, however often they come."""
    service = start_service(metrics_interval=3600)
    async with httpx.AsyncClient(base_url=service.url) as client:

        async def first_refresh() -> dict | None:
            samples = await scrape(client)
            return samples if value(samples, "jobq_gauges_refreshed_timestamp_seconds") else None

        before = await until(first_refresh)
        await post(client, "/jobs", {"queue": "late", "payload": None}, 201)
        for _ in range(5):
            samples = await scrape(client)
            assert value(samples, "jobq_gauges_refreshed_timestamp_seconds") == value(
                before, "jobq_gauges_refreshed_timestamp_seconds"
            )
            assert value(samples, "jobq_queue_jobs", queue="late", state="pending") is None
        assert value(samples, "jobq_jobs_enqueued_total", queue="late") == 1  # counters are live


async def test_lock_waits_are_visible(start_service, database_url):
    """A session blocked on a row lock in jobq's database shows in jobq_lock_waiting_sessions, and the
    gauge drops back once the lock is released."""
    service = start_service(metrics_interval=0.1)
    holder = await asyncpg.connect(database_url)
    waiter = await asyncpg.connect(database_url)
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            await post(client, "/queues/locked/pause", {})
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT * FROM jobq.queues WHERE name = 'locked' FOR UPDATE")
            blocked = asyncio.create_task(
                waiter.execute("UPDATE jobq.queues SET paused = false WHERE name = 'locked'")
            )

            def waiting(n: int):
                async def check() -> dict | None:
                    samples = await scrape(client)
                    enough = (
                        value(samples, "jobq_lock_waiting_sessions") >= n
                        if n
                        else value(samples, "jobq_lock_waiting_sessions") == 0
                    )
                    return samples if enough else None

                return check

            samples = await until(waiting(1))
            assert value(samples, "jobq_lock_wait_longest_seconds") > 0
            await tx.rollback()
            await blocked
            await until(waiting(0))
    finally:
        await holder.close()
        await waiter.close()


async def test_a_snapshot_that_holds_back_vacuum_is_named_within_one_interval(start_service, database_url):
    """A REPEATABLE READ session that keeps its snapshot while jobs flow: the next refresh of the gauges
    counts it (seconds and transactions behind), and /readyz and the dashboard name it (pid,
    application, state); once it ends, nothing holds the horizon and the gauges fall back."""
    interval = 0.2
    service = start_service(metrics_interval=interval)

    def finished_after(moment: float):
        async def check() -> dict | None:
            samples = await scrape(client)
            return samples if value(samples, "jobq_gauges_refreshed_timestamp_seconds") > moment else None

        return check

    async def refreshed_after(moment: float) -> dict:
        """The samples of a refresh begun after `moment`. The timestamp is taken when a refresh ends, so the
        first to end after `moment` may have read the database before it; the one after that began later."""
        first = await until(finished_after(moment))
        return await until(finished_after(value(first, "jobq_gauges_refreshed_timestamp_seconds")))

    holder = await asyncpg.connect(database_url, server_settings={"application_name": "report-export"})
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            tx = holder.transaction(isolation="repeatable_read")
            await tx.start()
            await holder.fetchval("SELECT count(*) FROM jobq.all_jobs")  # the snapshot is taken here
            held_from = time.time()
            pid = holder.get_server_pid()
            for n in range(20):  # jobs flow: each enqueue, lease and ack is a transaction it holds back
                await post(client, "/jobs", {"queue": "flow", "payload": n}, 201)
                (job,) = (await post(client, "/lease", {"queue": "flow"}))["jobs"]
                await post(client, "/ack", {"id": job["id"], "lease_token": job["lease_token"]})

            samples = await refreshed_after(time.time())
            held_for = time.time() - held_from
            seconds = value(samples, "jobq_xmin_horizon_age_seconds", holder="session")
            assert 0 < seconds <= held_for + 1
            assert value(samples, "jobq_xmin_horizon_age_transactions", holder="session") >= 20
            for kind in ("replication_slot", "prepared_transaction"):
                assert value(samples, "jobq_xmin_horizon_age_transactions", holder=kind) == 0
            assert value(samples, "jobq_jobs_table_dead_tuples") is not None
            assert value(samples, "jobq_claim_index_bytes") > 0

            ready = (await client.get("/readyz")).json()
            oldest = ready["database_health"]["oldest_snapshot"]
            assert ready["ready"] is True and ready["database_health"]["holding_back"] is False  # < 1 min
            assert (oldest["holder"], oldest["pid"], oldest["name"], oldest["state"]) == (
                "session",
                pid,
                "report-export",
                "idle in transaction",
            )
            assert oldest["xid_age"] >= 20 and oldest["query"] == "SELECT count(*) FROM jobq.all_jobs"
            page = (await client.get("/ui")).text
            assert f"session report-export (pid {pid}, idle in transaction)" in page

            await tx.rollback()

            await refreshed_after(time.time())
            ready = (await client.get("/readyz")).json()
            assert (ready["database_health"]["oldest_snapshot"] or {}).get("pid") != pid
            assert "report-export" not in (await client.get("/ui")).text
    finally:
        await holder.close()


def test_the_dashboard_warns_of_a_holder_open_a_minute():
    health = DatabaseHealth(
        [
            {
                "holder": "session",
                "pid": 7,
                "name": "psql",
                "state": "idle in transaction",
                "seconds": 75.0,
                "xid_age": 12345,
                "query": "SELECT 1",
            },
            {
                "holder": "replication_slot",
                "pid": None,
                "name": "standby_1",
                "state": "inactive",
                "seconds": None,
                "xid_age": 200,
                "query": None,
            },
        ],
        {
            "live_tuples": 10,
            "dead_tuples": 4000,
            "bytes": 3 * 2**20,
            "claim_index_bytes": 65536,
            "since_vacuum_seconds": None,
        },
    )
    html = pages.database_health(health)
    assert '<p class="flash warn horizon">' in html and "session psql (pid 7, idle in transaction)" in html
    assert "open 1 m 15 s, 12,345 transactions old" in html
    assert "4,000 dead; 3.0 MB, claim index 64 kB; no vacuum recorded" in html
    slot_only = pages.database_health(DatabaseHealth([health.horizon[1]], None))
    assert "replication slot standby_1: 200 transactions old." in slot_only and "warn" not in slot_only


async def test_request_latency_is_per_route_template(client):
    """Requests are timed per route template, never per raw path; unmatched paths share one label."""
    ids = []
    for i in range(3):
        ids.append((await post(client, "/jobs", {"queue": "r", "payload": i}, 201))["id"])
    for job_id in ids:
        assert (await client.get(f"/jobs/{job_id}")).status_code == 200
    assert (await client.get("/jobs/999999")).status_code == 404
    assert (await client.get("/no/such/path")).status_code == 404

    samples = await scrape(client)
    get_job = {"method": "GET", "route": "/jobs/{id}"}
    assert value(samples, "jobq_http_request_duration_seconds_count", **get_job) == 4
    assert value(samples, "jobq_http_requests_total", **get_job, status="200") == 3
    assert value(samples, "jobq_http_requests_total", **get_job, status="404") == 1
    assert value(samples, "jobq_http_request_duration_seconds_count", method="POST", route="/jobs") == 3
    assert value(samples, "jobq_http_requests_total", method="GET", route="<unmatched>", status="404") == 1
    routes = {dict(labels).get("route") for (_, labels) in samples}
    assert not any(route and route.startswith("/jobs/") and route != "/jobs/{id}" for route in routes)


async def test_each_app_counts_on_its_own(start_service):
    """Two services in one process (as in these tests): each has its own registry."""
    one, two = start_service(), start_service()
    async with httpx.AsyncClient(base_url=one.url) as a, httpx.AsyncClient(base_url=two.url) as b:
        await post(a, "/jobs", {"queue": "own", "payload": None}, 201)
        assert value(await scrape(a), "jobq_jobs_enqueued_total", queue="own") == 1
        assert value(await scrape(b), "jobq_jobs_enqueued_total", queue="own") is None


async def test_an_admin_token_when_tokens_are_configured(start_service):
    service = start_service(tokens={"w-secret": "worker", "a-secret": "admin"})
    async with httpx.AsyncClient(base_url=service.url) as client:
        assert (await client.get("/metrics")).status_code == 401
        worker = await client.get("/metrics", headers={"Authorization": "Bearer w-secret"})
        assert worker.status_code == 403
        admin = await client.get("/metrics", headers={"Authorization": "Bearer a-secret"})
        assert admin.status_code == 200 and "jobq_http_requests_total" in admin.text


def test_metrics_is_in_the_openapi_document():
    from app.main import create_app
    from app.settings import Settings

    spec = create_app(Settings(database_url="postgresql://unused/none")).openapi()
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert not any(path.startswith("/ui") for path in spec["paths"])


def plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


async def test_gauge_query_reads_no_finished_jobs(db):
    """Every replica reads the gauges every few seconds: with many completed jobs kept, the query walks
    the partial indexes of waiting, running and dead jobs, never the whole table."""
    from app.db.sql import QUEUE_GAUGES

    await db.execute("INSERT INTO jobq.queues (name) VALUES ('q')")
    await db.execute(
        "INSERT INTO jobq.jobs (queue, payload, status, completed_at)"
        " SELECT 'q', 'null', 'completed', now() FROM generate_series(1, 50000)"
    )
    await db.execute(
        "INSERT INTO jobq.jobs (queue, payload, status, lease_expires_at) SELECT 'q', 'null', s, now()"
        " FROM unnest(ARRAY['pending', 'running', 'dead']) s, generate_series(1, 5)"
    )
    await db.execute("ANALYZE jobq.jobs")
    (plan,) = json.loads(await db.fetchval("EXPLAIN (FORMAT JSON) " + QUEUE_GAUGES.text))
    scans = [
        (n["Node Type"], n.get("Index Name"))
        for n in plan_nodes(plan["Plan"])
        if n.get("Relation Name") == "jobs"
    ]
    assert scans and not any(kind == "Seq Scan" for kind, _ in scans), scans
    rows = await db.fetch(QUEUE_GAUGES.text)
    assert [(r["pending"], r["running"], r["dead"]) for r in rows] == [(5, 5, 5)]


async def test_leases_on_unknown_queues_add_no_series_and_keep_no_batchers(start_service):
    """Any client can name any queue: leasing from 50 names that are no queue adds no metric series and
    leaves no Batcher behind. Existing queues get their claim series, known from the gauges' snapshot or
    from a claim that leased something."""
    service = start_service(metrics_interval=0.1)
    runtime = service.app.state.runtime
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        await post(client, "/jobs", {"queue": "real", "payload": 1}, 201)
        await post(client, "/lease", {"queue": "real"})  # leased a job: the queue exists
        r = await client.patch("/queues/empty", json={"max_attempts": 3})  # exists, with no jobs
        assert r.status_code == 200, r.text

        async def snapshot_knows_empty() -> bool:
            return value(await scrape(client), "jobq_queue_paused", queue="empty") == 0

        await until(snapshot_knows_empty)
        await post(client, "/lease", {"queue": "empty"})  # claims nothing, on a queue that exists

        def claim_series(samples: dict) -> list[str]:
            return sorted(
                dict(labels)["queue"]
                for name, labels in samples
                if name == "jobq_claim_duration_seconds_count"
            )

        before = await scrape(client)
        assert claim_series(before) == ["empty", "real"]
        batchers = len(runtime.coalescing)

        leases = [
            client.post("/lease", json={"queue": f"nobody-{i}", "wait": 0.2 if i % 5 == 0 else 0})
            for i in range(50)
        ]
        for r in await asyncio.gather(*leases):
            assert r.status_code == 200 and r.json() == {"jobs": []}, r.text

        after = await scrape(client)
        assert claim_series(after) == ["empty", "real"]
        assert not [labels for _, labels in after if dict(labels).get("queue", "").startswith("nobody-")]
        assert len(after) == len(before)  # not one sample more
        assert len(runtime.coalescing) == batchers
