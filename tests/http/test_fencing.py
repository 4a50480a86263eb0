"""Fencing in shared statements (issue 12, points 2, 3 and 8): each item is answered by its own lease
token, one bad item never fails its neighbours, and a shared statement is retried item by item only
when PostgreSQL proved it committed nothing.

Coalescing is forced here, not hoped for. The services run one shared statement of a kind at a time
(`coalesce_concurrency=1`); `in_one_statement` holds a first call's statement in flight behind a lock
the test takes on `jobq.jobs`, waits until every call under test waits in the batcher for the next
statement (it checks), then lets go: those calls go in one statement together.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import asyncpg
import httpx
import pytest

from app import service
from app.core.errors import PayloadTooLarge, Unavailable
from app.http.schemas import AckRequest, NackRequest
from app.service.coalesce import Batcher, refused
from app.service.runtime import Runtime
from tests.fixtures import Service
from tests.helpers import assert_problem, enqueue_many, lease, open_runtime
from tests.pgproxy import PgProxy
from tests.waiting import until

pytestmark = pytest.mark.anyio

Call = Callable[[], Awaitable]


def batcher_of(runtime: Runtime, key: object) -> Batcher | None:
    """The process's batcher for `key` (a kind's name, or a kind's name and a queue) if a call has made
    it (looked up, never made: the Runtime keeps the fixed ones, and those for a queue only while calls
    are in them)."""
    return runtime.coalescing.find(*key) if isinstance(key, tuple) else runtime.coalescing.find(key)


async def in_one_statement(
    runtime: Runtime,
    database_url: str,
    key: object,
    first: Call,
    rest: list[Call],
    then: Call | None = None,
) -> tuple[object, list[object]]:
    """Run `first` alone, then all of `rest` together in one shared statement of the batcher `key`
    (`runtime` shares one statement of a kind at a time); their answers, or the exceptions they raised.
    `then`, if given, runs once the lock is gone, before the answers are awaited."""
    assert runtime.settings.coalesce_concurrency == 1
    lock = await asyncpg.connect(database_url)
    try:
        async with lock.transaction():
            await lock.execute("LOCK TABLE jobq.jobs IN EXCLUSIVE MODE")
            held = asyncio.ensure_future(first())
            batcher = await until(lambda: batcher_of(runtime, key))
            await until(lambda: batcher.in_flight == 1 and batcher.waiting == 0)  # `first` is taken
            calls = [asyncio.ensure_future(call()) for call in rest]
            await until(lambda: batcher.waiting == len(rest))  # all of them wait for the next one
        if then is not None:
            await then()
        return await held, list(await asyncio.gather(*calls, return_exceptions=True))
    finally:
        await lock.close()


async def stale_and_current(client: httpx.AsyncClient, db, queue: str) -> tuple[int, str, str]:
    """A job whose first lease expired and which another worker then leased: (id, the first worker's
    token, now stale, the second worker's, current)."""
    (job_id,) = await enqueue_many(client, queue, 1)
    (first,) = await lease(client, queue, visibility_timeout=0.05)
    await until(lambda: db.fetchval("SELECT status = 'pending' FROM jobq.all_jobs WHERE id = $1", job_id))
    (second,) = await lease(client, queue)
    assert second["id"] == job_id
    return job_id, first["lease_token"], second["lease_token"]


async def job_row(db, job_id: int):
    return await db.fetchrow(
        "SELECT status, attempts, lease_token::text || '.' || queue AS lease_token, last_error"
        " FROM jobq.all_jobs WHERE id = $1",
        job_id,
    )


def item(job_id: int, token: str, **extra: object) -> dict:
    return {"id": job_id, "lease_token": token, **extra}


async def posted_together(
    service: Service, database_url: str, client: httpx.AsyncClient, path: str, bodies: list[dict]
) -> tuple[object, list[object]]:
    """`POST /{path}` (ack or nack) of a job of queue `warm` alone, then of each of `bodies` in one shared
    statement (see in_one_statement); the answers."""
    await enqueue_many(client, "warm", 1)
    (warm,) = await lease(client, "warm")
    return await in_one_statement(
        service.app.state.runtime,
        database_url,
        path,
        lambda: client.post(f"/{path}", json=item(warm["id"], warm["lease_token"])),
        [lambda body=body: client.post(f"/{path}", json=body) for body in bodies],
    )


LOST = {"ok": False, "code": "lease_lost"}


# --- point 2: each item's answer is its own ------------------------------------------------------


async def test_ack_batch_answers_each_item_by_its_own_token(client, db):
    a, a_stale, a_current = await stale_and_current(client, db, "a")
    b, b_stale, b_current = await stale_and_current(client, db, "b")
    items = [item(a, a_stale), item(a, a_current), item(b, b_current), item(b, b_stale)]
    r = await client.post("/ack/batch", json={"items": items})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [
        {"id": a, **LOST},
        {"id": a, "ok": True},
        {"id": b, "ok": True},
        {"id": b, **LOST},
    ]
    for job_id, token in ((a, a_current), (b, b_current)):
        row = await job_row(db, job_id)
        assert (row["status"], row["lease_token"]) == ("completed", token)

    # Repeated: the holder's ack is still its own (idempotent), the stale one still is not.
    again = await client.post("/ack/batch", json={"items": items})
    assert again.json()["results"] == r.json()["results"]


async def test_nack_batch_answers_the_holder_not_the_first_item(client, db):
    job_id, stale, current = await stale_and_current(client, db, "q")
    items = [
        item(job_id, stale, error="stale", retry_after=60),
        item(job_id, current, error="current", retry_after=60),
    ]
    r = await client.post("/nack/batch", json={"items": items})
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first == {"id": job_id, **LOST}
    assert (second["id"], second["ok"], second["status"]) == (job_id, True, "pending")
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"], row["lease_token"], row["last_error"]) == (
        "pending",
        2,
        None,
        "current",
    )


async def test_release_answers_the_holder_not_the_first_item(client, db):
    job_id, stale, current = await stale_and_current(client, db, "q")
    r = await client.post("/release", json={"items": [item(job_id, stale), item(job_id, current)]})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{"id": job_id, **LOST}, {"id": job_id, "ok": True}]
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"], row["lease_token"]) == ("pending", 1, None)


async def test_the_same_token_twice_in_one_batch(client, db):
    """An ack repeated is still done (both ok); a nack or release repeated ends the lease once."""
    await enqueue_many(client, "q", 3)
    acked, nacked, released = await lease(client, "q", max_jobs=3)
    mine = [item(acked["id"], acked["lease_token"])] * 2
    r = await client.post("/ack/batch", json={"items": mine})
    assert r.json()["results"] == [{"id": acked["id"], "ok": True}] * 2
    mine = [item(nacked["id"], nacked["lease_token"], retry_after=60)] * 2
    first, second = (await client.post("/nack/batch", json={"items": mine})).json()["results"]
    assert (first["ok"], first["status"]) == (True, "pending")
    assert second == {"id": nacked["id"], **LOST}
    mine = [item(released["id"], released["lease_token"])] * 2
    r = await client.post("/release", json={"items": mine})
    assert r.json()["results"] == [{"id": released["id"], "ok": True}, {"id": released["id"], **LOST}]
    statuses = {r["id"]: r["status"] for r in await db.fetch("SELECT id, status FROM jobq.all_jobs")}
    assert statuses == {acked["id"]: "completed", nacked["id"]: "pending", released["id"]: "pending"}


async def test_coalesced_acks_of_two_workers_are_answered_by_their_own_tokens(
    start_service, database_url, db
):
    service = start_service(coalesce_concurrency=1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        a, a_stale, a_current = await stale_and_current(client, db, "a")
        b, b_stale, b_current = await stale_and_current(client, db, "b")
        calls = [
            item(a, a_stale),
            item(a, a_current),
            item(b, b_current),
            item(b, b_stale),
            item(b, b_current),
        ]
        first, answers = await posted_together(service, database_url, client, "ack", calls)
    assert first.status_code == 200
    # The stale ones are refused although their job was completed in the same statement; the holder's
    # ack sent twice is done twice.
    assert [r.status_code for r in answers] == [409, 200, 200, 409, 200]
    assert_problem(answers[0], 409, "lease_lost")
    for job_id, token in ((a, a_current), (b, b_current)):
        row = await job_row(db, job_id)
        assert (row["status"], row["lease_token"]) == ("completed", token)


async def test_coalesced_nacks_answer_the_holder_when_the_stale_one_comes_first(
    start_service, database_url, db
):
    service = start_service(coalesce_concurrency=1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        job_id, stale, current = await stale_and_current(client, db, "q")
        calls = [
            item(job_id, stale, error="stale", retry_after=60),
            item(job_id, current, error="current", retry_after=60),
        ]
        first, answers = await posted_together(service, database_url, client, "nack", calls)
    assert first.status_code == 200
    assert [r.status_code for r in answers] == [409, 200]
    assert answers[1].json()["status"] == "pending"
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 2, "current")


# --- point 3: one bad item fails no neighbour -----------------------------------------------------


def raw_json(body: object) -> dict:
    """A request whose JSON escapes every non-ASCII character (httpx's json= cannot send a lone
    surrogate: it encodes the text as UTF-8 first)."""
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


async def test_nacks_with_lone_surrogates_are_cleaned_and_spoil_no_neighbour(start_service, database_url, db):
    service = start_service(coalesce_concurrency=1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        ids = await enqueue_many(client, "q", 20)
        leased = await lease(client, "q", max_jobs=20)
        assert sorted(j["id"] for j in leased) == sorted(ids)
        errors = {j["id"]: f"failed {j['id']}" for j in leased}
        for job in (leased[4], leased[12]):
            errors[job["id"]] = f"failed {job['id']} \udce9 \ud800x"

        def nack(job: dict) -> Call:
            body = item(job["id"], job["lease_token"], error=errors[job["id"]], retry_after=60)
            return lambda: client.post("/nack", **raw_json(body))

        first, answers = await in_one_statement(
            service.app.state.runtime,
            database_url,
            "nack",
            nack(leased[0]),
            [nack(job) for job in leased[1:]],
        )
    assert [r.status_code for r in [first, *answers]] == [200] * 20, [
        r.text for r in answers if r.status_code != 200
    ]
    rows = await db.fetch("SELECT id, status, attempts, last_error FROM jobq.all_jobs")
    assert {(r["status"], r["attempts"]) for r in rows} == {("pending", 1)}
    cleaned = {
        job_id: text.replace("\udce9", "\ufffd").replace("\ud800", "\ufffd")
        for job_id, text in errors.items()
    }
    assert {r["id"]: r["last_error"] for r in rows} == cleaned
    assert cleaned[leased[4]["id"]] == f"failed {leased[4]['id']} \ufffd \ufffdx"


async def test_a_lease_postgresql_refuses_fails_alone(start_service, database_url, db):
    service = start_service(coalesce_concurrency=1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        await enqueue_many(client, "q", 10)
        workers = ["w1", "w2", "bad\u0000", "w3", "w4"]  # PostgreSQL text cannot hold U+0000
        first, answers = await in_one_statement(
            service.app.state.runtime,
            database_url,
            ("lease", "q"),
            lambda: client.post("/lease", json={"queue": "q", "worker_id": "w0"}),
            [lambda w=w: client.post("/lease", json={"queue": "q", "worker_id": w}) for w in workers],
        )
    assert first.status_code == 200 and len(first.json()["jobs"]) == 1
    assert [r.status_code for r in answers] == [200, 200, 422, 200, 200]
    assert_problem(answers[2], 422, "validation_error")
    got = [j["id"] for r in (first, *answers) if r.status_code == 200 for j in r.json()["jobs"]]
    assert len(got) == len(set(got)) == 5
    rows = await db.fetch("SELECT id, worker_id FROM jobq.all_jobs WHERE status = 'running'")
    assert {r["id"] for r in rows} == set(got)
    assert sorted(r["worker_id"] for r in rows) == ["w0", "w1", "w2", "w3", "w4"]
    assert (
        await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'pending' AND attempts = 0") == 5
    )


async def test_an_enqueue_postgresql_refuses_fails_alone(start_service, database_url, db):
    service = start_service(coalesce_concurrency=1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        # jsonb cannot hold U+0000; UTF-8 cannot encode a lone surrogate.
        payloads = [{"n": 1}, {"n": 2}, {"n": "\u0000"}, {"n": 4}, {"n": "\udce9"}, {"n": 6}]

        def post(payload: object) -> Call:
            return lambda: client.post("/jobs", **raw_json({"queue": "q", "payload": payload}))

        first, answers = await in_one_statement(
            service.app.state.runtime, database_url, "enqueue", post({"n": 0}), [post(p) for p in payloads]
        )
    assert [r.status_code for r in [first, *answers]] == [201, 201, 201, 422, 201, 422, 201]
    assert_problem(answers[2], 422, "validation_error")
    assert_problem(answers[4], 422, "validation_error")
    stored = await db.fetch("SELECT payload FROM jobq.all_jobs ORDER BY id")
    assert sorted(json.loads(r["payload"])["n"] for r in stored) == [0, 1, 2, 4, 6]


@pytest.fixture
async def local_runtime(database_url):
    """A Runtime in the test's own event loop, sharing one statement of a kind at a time."""
    async with open_runtime(database_url, coalesce_concurrency=1) as runtime:
        yield runtime


@pytest.mark.parametrize("kind", ["ack", "nack"])
async def test_acks_and_nacks_a_driver_refuses_fail_alone(kind, local_runtime, database_url, client, db):
    """Nothing a client can send over HTTP poisons an ack or nack any more; an id past bigint, which
    the driver refuses to encode, stands in for whatever might."""
    await enqueue_many(client, "q", 5)
    leased = await lease(client, "q", max_jobs=5)
    model, call = (AckRequest, service.ack) if kind == "ack" else (NackRequest, service.nack)
    calls = [model(id=j["id"], lease_token=j["lease_token"]) for j in leased[1:]]
    calls.insert(2, model.model_construct(**{**calls[0].model_dump(), "id": 2**63}))  # unchecked
    first, answers = await in_one_statement(
        local_runtime,
        database_url,
        kind,
        lambda: call(local_runtime, model(id=leased[0]["id"], lease_token=leased[0]["lease_token"])),
        [lambda c=c: call(local_runtime, c) for c in calls],
    )
    assert first["ok"] is True
    assert isinstance(answers[2], asyncpg.DataError), answers[2]
    assert [a["ok"] for k, a in enumerate(answers) if k != 2] == [True] * 4
    expected = "completed" if kind == "ack" else "pending"
    assert await db.fetchval("SELECT array_agg(DISTINCT status) FROM jobq.all_jobs") == [expected]


# --- point 8 (server half): retry alone only what provably did not commit -------------------------


async def test_only_a_refusal_is_retried_alone(db, database_url):
    """The rule of app/service/coalesce.py, against errors a real PostgreSQL and asyncpg raise."""

    async def error_of(conn: asyncpg.Connection, statement: str, *args: object) -> BaseException:
        with pytest.raises(Exception) as caught:
            await conn.fetch(statement, *args)
        return caught.value

    await db.execute("CREATE TEMP TABLE t (x int PRIMARY KEY); INSERT INTO t VALUES (1)")
    # PostgreSQL answered the statement with an ERROR: rolled back, nothing committed.
    assert refused(await error_of(db, "INSERT INTO t VALUES (1)"))  # unique violation
    assert refused(await error_of(db, "SELECT $1::text", "a\u0000"))  # invalid byte sequence
    # The driver could not encode an argument, and sent nothing.
    assert refused(await error_of(db, "SELECT $1::bigint", 2**63))
    assert refused(await error_of(db, "SELECT $1::text", "\udce9"))
    # The service's own refusal of an item, made before any statement.
    assert refused(PayloadTooLarge("too big"))
    with pytest.raises(UnicodeEncodeError) as caught:
        "\udce9".encode()
    assert refused(caught.value)

    # Errors that prove nothing: they may follow a commit.
    other = await asyncpg.connect(database_url)
    try:
        await other.execute("SET statement_timeout = '50ms'")
        assert not refused(await error_of(other, "SELECT pg_sleep(10)"))  # statement_timeout (57014)
        await other.execute("RESET statement_timeout")
        sleeping = asyncio.ensure_future(error_of(other, "SELECT pg_sleep(30)"))
        pid = other.get_server_pid()
        await until(
            lambda: db.fetchval("SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $1", pid)
        )
        assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
        assert not refused(await sleeping)  # terminated (FATAL 57P01), or the connection lost
        assert not refused(await error_of(other, "SELECT 1"))  # the connection is gone
    finally:
        await other.close()
    assert not refused(TimeoutError())  # the pool's, or a command timeout
    assert not refused(Unavailable("the database is unreachable"))


async def test_a_shared_enqueue_cut_after_commit_is_not_inserted_again(start_service, database_url, db):
    """The connection of a shared INSERT is lost after PostgreSQL committed it: its callers are told
    503 (the client decides), and nothing is inserted a second time."""
    proxy = PgProxy(database_url).start()
    service = start_service(database_url=proxy.dsn, coalesce_concurrency=1)
    try:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:

            def post(n: int) -> Call:
                return lambda: client.post("/jobs", json={"queue": "q", "payload": {"n": n}})

            # The enqueue statements' own text: "INSERT INTO jobq.jobs" alone is also in the background
            # loops' statements (jobs_history, schedules), run meanwhile. The first enqueue is `first`'s,
            # the second the shared one.
            proxy.cut("payload::jsonb, coalesce(priority, 0)", nth=2)
            first, answers = await in_one_statement(
                service.app.state.runtime, database_url, "enqueue", post(0), [post(n) for n in range(1, 20)]
            )
    finally:
        service.stop()
        proxy.stop()
    assert proxy.cut_done.is_set() and proxy.cut_after_commit
    rows = await db.fetch("SELECT id, payload FROM jobq.all_jobs")
    stored = Counter(json.loads(r["payload"])["n"] for r in rows)
    assert stored == Counter(range(20)), stored  # each once: the committed statement was not repeated
    ids = {json.loads(r["payload"])["n"]: r["id"] for r in rows}
    assert first.status_code == 201 and first.json()["id"] == ids[0]
    for r in answers:
        assert_problem(r, 503, "unavailable")


async def test_a_shared_enqueue_whose_backend_is_terminated_is_not_retried(start_service, database_url, db):
    """pg_terminate_backend mid-statement: a connection-level failure, which can follow a commit (a
    terminate during a synchronous-replication wait does), so it goes to every caller as it is."""
    service = start_service(coalesce_concurrency=1)
    blocker = await asyncpg.connect(database_url)

    async def waiting_insert(other_than: int | None = None) -> int | None:
        return await db.fetchval(
            # Waiting for the transaction that inserted "b" (`first`, held by the table lock, waits
            # on the relation instead, and only until that lock goes).
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = 'jobq' AND datname = current_database()"
            " AND wait_event = 'transactionid' AND query LIKE '%INSERT INTO jobq.jobs%'"
            " AND pid IS DISTINCT FROM $1",
            other_than,
        )

    try:
        # An uncommitted insert of queue "b" holds every statement that creates "b" (ON CONFLICT waits).
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("INSERT INTO jobq.queues (name) VALUES ('b')")

        async def terminate() -> None:
            pid = await until(waiting_insert)
            assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
            # Let "b" go only once the shared statement's callers are answered, or one of them is
            # retried alone (and waits on "b" in its turn).
            batcher = batcher_of(service.app.state.runtime, "enqueue")
            await until(lambda: batcher.in_flight == 0 or waiting_insert(other_than=pid))
            await tx.rollback()

        async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:

            def post(queue: str, n: int) -> Call:
                return lambda: client.post("/jobs", json={"queue": queue, "payload": n})

            first, answers = await in_one_statement(
                service.app.state.runtime,
                database_url,
                "enqueue",
                post("a", 0),
                [post("b", n) for n in range(1, 11)],
                then=terminate,
            )
    finally:
        await blocker.close()
    assert first.status_code == 201
    for r in answers:
        assert_problem(r, 503, "unavailable")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'b'") == 0
