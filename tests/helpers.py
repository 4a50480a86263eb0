"""What many tests do alike, written once: check a problem answer, call the HTTP API and insist it
succeeds, read a job's state from the database, open the service layer's Database (or Runtime), check
that a stopped worker left nothing leased, record every change of a job's state. Waiting on a condition
is tests/waiting.py.

The server's tests import it as ``helpers``, the client's (clients/python/tests) as ``tests.helpers``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.db import sql as q
from app.db.pool import Database, create_pool
from app.service.runtime import Runtime
from jobq import AsyncClient
from tests.fixtures import test_settings
from tests.waiting import quiet, until

# The advisory locks held in this database: the server's others (other tests', run beside this one on a
# shared server) are not this test's business.
ADVISORY_LOCKS_HERE = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)

# A test-only trigger that records every status change of every job, in the order the statements ran
# (`seq`), with the start of the statement that made it (`at`, statement_timestamp(): the clock a claim's
# rate windows use, app/db/sql/fragments.py WINDOW_CLOCK). Installed in a test's database; read from
# public.history.
# A job that leaves jobq.jobs (completed or cancelled, moved to jobs_history; or deleted) is recorded
# with `new` = 'gone'.
STATUS_HISTORY = """
CREATE TABLE public.history (
    seq bigserial PRIMARY KEY, job bigint, queue text, key text, old text, new text,
    at timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE FUNCTION public.record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO public.history (job, queue, key, old, new)
        VALUES (OLD.id, OLD.queue, OLD.key, OLD.status, 'gone');
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO public.history (job, queue, key, old, new)
        VALUES (NEW.id, NEW.queue, NEW.key, OLD.status, NEW.status);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER record AFTER UPDATE OR DELETE ON jobq.jobs FOR EACH ROW EXECUTE FUNCTION public.record();
"""

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}
MAX_BATCH = 1000  # jobs in one POST /jobs/batch, at most


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    """An RFC 9457 problem answer with this status and the contract's stable `code`; its body."""
    assert response.status_code == status, response.text
    ctype = response.headers.get("content-type", "").split(";")[0].strip()
    assert ctype == "application/problem+json", ctype
    body = response.json()
    assert PROBLEM_KEYS <= body.keys(), body
    assert body["status"] == status and body["code"] == code, body
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str)
    assert "Traceback" not in response.text
    return body


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- the HTTP API, each call required to succeed ----------------------------------------------------


async def enqueue(client: httpx.AsyncClient, queue: str = "q", payload: Any = None, **fields: Any) -> dict:
    """`POST /jobs`, answered 201 (a new job); the job."""
    r = await client.post("/jobs", json={"queue": queue, "payload": payload, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def enqueue_many(client: httpx.AsyncClient, queue: str, n: int) -> list[int]:
    """`n` jobs (payloads 0 to n-1) by `POST /jobs/batch`, as few batches as the API allows, each
    answered 201 with its jobs in order; their ids, in order."""
    ids: list[int] = []
    for start in range(0, n, MAX_BATCH):
        payloads = list(range(start, min(start + MAX_BATCH, n)))
        jobs = [{"queue": queue, "payload": p} for p in payloads]
        r = await client.post("/jobs/batch", json={"jobs": jobs})
        assert r.status_code == 201, r.text
        assert [j["payload"] for j in r.json()["jobs"]] == payloads
        ids.extend(j["id"] for j in r.json()["jobs"])
    assert len(set(ids)) == n
    return ids


async def lease(client: httpx.AsyncClient, queue: str = "q", **fields: Any) -> list[dict]:
    """`POST /lease`, answered 200; the jobs leased (none is an answer too)."""
    r = await client.post("/lease", json={"queue": queue, **fields})
    assert r.status_code == 200, r.text
    assert set(r.json()) >= {"jobs"}
    return r.json()["jobs"]


async def lease_one(
    client: httpx.AsyncClient, queue: str = "q", job_id: int | None = None, **fields: Any
) -> dict:
    """`POST /lease` that leases exactly one job (the job `job_id`, if given); that job."""
    jobs = await lease(client, queue, **fields)
    assert len(jobs) == 1, jobs
    if job_id is not None:
        assert jobs[0]["id"] == job_id, jobs
    return jobs[0]


async def make_dead(client: httpx.AsyncClient, queue: str = "q", error: str = "boom", **fields: Any) -> int:
    """A dead job: enqueued with max_attempts=1 (and `fields`), leased, nacked. The queue must have no
    other ready job. The job's id."""
    job = await enqueue(client, queue, max_attempts=1, **fields)
    leased = await lease_one(client, queue, job["id"])
    r = await client.post(
        "/nack", json={"id": job["id"], "lease_token": leased["lease_token"], "error": error}
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "dead"
    return job["id"]


# --- the database, read directly --------------------------------------------------------------------


async def count(db: asyncpg.Connection, where: str = "TRUE", *args: Any, table: str = "all_jobs") -> int:
    """Rows of a jobq table or view (all_jobs unless `table` says) that match `where`, with `args` as $1,
    $2 ..."""
    return await db.fetchval(f"SELECT count(*) FROM jobq.{table} WHERE {where}", *args)


async def row(db: asyncpg.Connection, job_id: int) -> asyncpg.Record | None:
    """The job's row, every column."""
    return await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", job_id)


async def index_columns(db: asyncpg.Connection, where: str, *args: Any) -> list[asyncpg.Record]:
    """The indexes of jobq's tables that `where` picks (over pg_index `i` and the table `t`): each as
    `table_name`, `index_name` and `columns`, in the index's own order."""
    return await db.fetch(
        f"""SELECT t.relname AS table_name, c.relname AS index_name,
                   array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum)) AS columns
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indexrelid
            JOIN pg_class t ON t.oid = i.indrelid
            JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(i.indkey)
            WHERE t.relnamespace = 'jobq'::regnamespace AND ({where})
            GROUP BY 1, 2""",
        *args,
    )


async def db_now(db: asyncpg.Connection) -> datetime:
    """The database's clock (the start of its current transaction), which deadlines are set by."""
    return await db.fetchval("SELECT now()")


async def status_of(db: asyncpg.Connection, job_id: int) -> str | None:
    """The job's status; None once the row is gone."""
    return await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job_id)


@asynccontextmanager
async def open_database(database_url: str, **overrides: Any) -> AsyncIterator[Database]:
    """The service layer's Database on a pool in the test's own event loop (one connection kept open;
    `overrides` change other settings), closed afterwards: for calling app.service without HTTP."""
    settings = test_settings(database_url, **{"pool_min_size": 1, **overrides})
    assert settings.database_url is not None
    pool = await create_pool(settings.database_url, settings)
    try:
        yield Database(pool, settings, session_url=settings.session_url(database_url))
    finally:
        await pool.close()


@asynccontextmanager
async def open_runtime(database_url: str, **overrides: Any) -> AsyncIterator[Runtime]:
    """A service process's Runtime on open_database's Database, its wake-ups not started: for calling the
    app.service operations that take one."""
    async with open_database(database_url, **overrides) as database:
        yield Runtime(database)


# --- a stopped worker -------------------------------------------------------------------------------


async def assert_nothing_stranded(
    service: Any, db: asyncpg.Connection, queue: str, token: str | None = None
) -> None:
    """A job enqueued once the worker has stopped stays pending, its attempt not counted: the worker's
    long-poll ended with it (had it gone on, the job would be leased for nobody, running until its lease
    expired). The service gets the time to lease it if anyone still polled: until no long-poll waits.
    The test's database must hold no other job: every job there is checked."""
    async with AsyncClient(service.url, token=token) as client:
        job = await client.enqueue(queue, "after the stop")
    await until(quiet(service))
    rows = await db.fetch("SELECT id, status, attempts FROM jobq.all_jobs")
    assert {r["id"]: (r["status"], r["attempts"]) for r in rows} == {job.id: ("pending", 0)}


def function_body(name: str) -> str:
    """The body of SQL function `name` (`jobq.await_event`) as app/db/functions.sql has it."""
    text = (Path(__file__).parent.parent / "app" / "db" / "functions.sql").read_text()
    start = text.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return text[start : text.index("$$;", text.index("AS $$", start))]


def front_claim_statements() -> tuple[q.Query, q.Query]:
    """The two statements of jobq.lease_flow_front() (alembic 0021, FRONT and LEASE), as queries with the
    same named parameters: for tests that read their plans. LEASE takes FRONT's jobs as :ids and :keys."""
    revision = importlib.import_module("app.db.alembic.versions.0021_lease_flow_front")
    return q.Query.define("flow_front", revision.FRONT), q.Query.define("flow_front_lease", revision.LEASE)
