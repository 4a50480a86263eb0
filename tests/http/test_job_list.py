"""GET /jobs: jobs of every status, filtered, searched and paged newest first (API additions, part 5)."""

import json

import pytest

from app.core.access import Grant, Role
from app.service import operators
from tests.helpers import assert_problem, enqueue, index_columns, lease_one, make_dead, open_database

pytestmark = pytest.mark.anyio


async def listed(client, **params) -> dict:
    r = await client.get("/jobs", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def ids(client, **params) -> list[int]:
    return [job["id"] for job in (await listed(client, **params))["jobs"]]


async def test_every_status_newest_first_and_each_filter(client):
    pending = (await enqueue(client, "mail", {"to": "ada@example.com"}, kind="send", key="ada"))["id"]
    other = (await enqueue(client, "mail", {"to": "bob@example.com"}, kind="send", key="bob"))["id"]
    running = (
        await enqueue(client, "mail", {"to": "cy"}, kind="digest", dedup_key="Weekly-Digest", priority=-1)
    )["id"]
    await lease_one(client, "mail", running)
    dead = await make_dead(client, "reports", error="Timeout talking to S3", kind="build")
    cancelled = (await enqueue(client, "reports", "x", run_at="2099-01-01T00:00:00Z"))["id"]
    assert (await client.delete(f"/jobs/{cancelled}")).status_code == 200

    assert await ids(client) == [cancelled, dead, running, other, pending]
    page = await listed(client)
    assert page["next_before_id"] is None
    assert [job["status"] for job in page["jobs"]] == ["cancelled", "dead", "running", "pending", "pending"]
    assert page["jobs"][1]["last_error"] == "Timeout talking to S3" and page["jobs"][1]["kind"] == "build"

    assert await ids(client, queue="mail") == [running, other, pending]
    assert await ids(client, status="pending") == [other, pending]
    assert await ids(client, status="running") == [running]
    assert await ids(client, queue="reports", status="dead") == [dead]
    assert await ids(client, kind="send") == [other, pending]
    assert await ids(client, key="ada") == [pending]
    assert await ids(client, queue="mail", kind="send", key="bob") == [other]
    assert await ids(client, status="completed") == []
    # The search: payload text, last error and dedup_key, in any case; LIKE's own characters are literal.
    assert await ids(client, q="ADA@example") == [pending]
    assert await ids(client, q="timeout") == [dead]
    assert await ids(client, q="weekly-digest") == [running]
    assert await ids(client, q="example.com", queue="mail") == [other, pending]
    assert await ids(client, q="%") == [] and await ids(client, q="_") == []


async def test_pages_follow_next_before_id_to_the_end(client):
    made = [
        job["id"]
        for job in (
            await client.post("/jobs/batch", json={"jobs": [{"queue": "p", "payload": i} for i in range(7)]})
        ).json()["jobs"]
    ]
    seen, before = [], None
    while True:
        page = await listed(client, queue="p", limit=3, **({"before_id": before} if before else {}))
        seen += [job["id"] for job in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
        assert len(page["jobs"]) == 3
    assert seen == sorted(made, reverse=True)


async def test_a_page_reads_a_bounded_window_and_says_where_to_go_on(client, db, monkeypatch):
    """A rare match among many jobs: each page reads at most LIST_SCAN jobs, comes back short (or empty)
    with the window's oldest id, and following it finds the match without skipping or repeating."""
    monkeypatch.setattr(operators, "LIST_SCAN", 5)
    rare = (await enqueue(client, "w", "needle"))["id"]
    for i in range(12):
        await enqueue(client, "w", f"hay {i}")
    pages, found, before = 0, [], None
    while True:
        page = await listed(client, q="needle", **({"before_id": before} if before else {}))
        pages += 1
        found += [job["id"] for job in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
    assert found == [rare] and pages == 3  # 13 jobs in windows of 5
    empty = await listed(client, q="needle")
    assert empty["jobs"] == [] and empty["next_before_id"] == rare + 8  # the 5 newest read, none matched


async def test_bad_filters_are_refused_in_words(client):
    await enqueue(client, "q")
    r = await client.get("/jobs", params={"status": "finished"})
    body = assert_problem(r, 422, "validation_error")
    assert "pending" in r.text and "status" in r.text, body
    assert_problem(await client.get("/jobs", params={"limit": 501}), 422, "validation_error")
    assert_problem(await client.get("/jobs", params={"q": ""}), 422, "validation_error")
    assert_problem(await client.get("/jobs", params={"sort": "id"}), 422, "validation_error")
    r = await client.get("/jobs", params={"queue": "nosuch"})
    assert_problem(r, 404, "not_found")
    assert "nosuch" in r.json()["detail"]


# --- a token limited to some queues, among many jobs of another ---------------------------------------


async def _finished(db, queue: str, count: int, payload: str = '"done"') -> None:
    """`count` completed jobs of `queue` kept in jobs_history, newer than every job so far."""
    await db.execute("INSERT INTO jobq.queues (name) VALUES ($1) ON CONFLICT DO NOTHING", queue)
    await db.execute(
        """INSERT INTO jobq.jobs_history (id, queue, status, payload, priority, run_at, attempts, created_at,
                                          updated_at, completed_at, awaited, purge_after)
           SELECT nextval('jobq.jobs_id_seq'), $1, 'completed', $2::jsonb, 0, now(), 1, now(), now(), now(),
                  false, now() + interval '1 day'
           FROM generate_series(1, $3)""",
        queue,
        payload,
        count,
    )


def _scans(plan: dict) -> list[dict]:
    """The plan's nodes that read a table of jobs."""
    found = [plan] if plan.get("Relation Name", "").startswith("jobs") else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _rows_read(scan: dict) -> int:
    removed = scan.get("Rows Removed by Filter", 0) + scan.get("Rows Removed by Index Recheck", 0)
    return (scan["Actual Rows"] + removed) * scan["Actual Loops"]


FOREIGN = 50_000


@pytest.fixture
async def foreign_jobs(db):
    """The jobs of `qa` and `qa-b` (35 in all, some pending, the rest finished), then FOREIGN finished
    jobs of `big`, newer than all of them, and more pending there: what a scoped page must not read."""
    await _finished(db, "qa", 20)
    await _finished(db, "qa-b", 10)
    await db.execute(
        """INSERT INTO jobq.jobs (queue, status, payload, priority, run_at, attempts, created_at, updated_at,
                                  awaited)
           SELECT 'qa', 'pending', '1', 0, now(), 0, now(), now(), false FROM generate_series(1, 5)"""
    )
    await _finished(db, "big", FOREIGN)
    await db.execute(
        """INSERT INTO jobq.jobs (queue, status, payload, priority, run_at, attempts, created_at, updated_at,
                                  awaited)
           SELECT 'big', 'pending', '1', 0, now(), 0, now(), now(), false FROM generate_series(1, 2000)"""
    )
    await db.execute("ANALYZE jobq.jobs; ANALYZE jobq.jobs_history")


@pytest.mark.parametrize(
    "filters",
    [{}, {"search": "needle"}, {"kind": "nothing"}, {"status": "completed"}, {"status": "pending"}],
    ids=["none", "search", "kind", "completed", "pending"],
)
async def test_a_scoped_page_reads_its_queues_through_their_index_only(
    database_url, db, foreign_jobs, filters
):
    """A token limited to `qa*` lists its 35 jobs reading no job of `big`, through the (queue, id) index a
    page of `?queue=qa` reads, however many newer jobs `big` holds (EXPLAIN ANALYZE counts the rows
    read); a filter on the queue inside a walk of the primary key read all of them."""
    async with open_database(database_url) as jobq_db, jobq_db.acquire() as conn:

        async def plan(**where) -> list[dict]:
            query, args = await operators.list_window(conn, **filters, **where)
            (explained,) = json.loads(
                await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {query.text}", *args)
            )
            return _scans(explained["Plan"])

        scoped = await plan(scope=Grant([Role.ADMIN], ["qa*"]).like)
        one = await plan(scope=Grant([Role.ADMIN], ["qa"]).like)
        named = await plan(queue="qa")
    assert sum(map(_rows_read, scoped)) <= 35, scoped
    assert sum(map(_rows_read, one)) <= 25, one

    def reading(scans: list[dict]) -> set[str | None]:  # the indexes that found jobs
        return {scan.get("Index Name") for scan in scans if scan["Actual Rows"]}

    indexes = reading(scoped)
    assert indexes == reading(named) == reading(one)
    leading = {i["index_name"]: i["columns"][0] for i in await index_columns(db, "true")}
    assert indexes and all(leading.get(name) == "queue" for name in indexes), indexes


async def test_a_scope_of_several_queues_pages_through_all_their_jobs(database_url, db, monkeypatch):
    """A scope's queues share a page's window: each reads its share, and a page goes no lower than the
    newest place where one of them stopped, so that following next_before_id finds every match of every
    queue once, newest first, whichever queue holds the most of them."""
    monkeypatch.setattr(operators, "LIST_SCAN", 6)  # 3 jobs per queue and page
    # The oldest needles are qa-b's: a page that took them while qa's window ended above its own needle
    # below the hay would skip that one.
    await _finished(db, "qa-b", 3, '"needle b"')
    await _finished(db, "qa", 1, '"needle a"')
    await _finished(db, "qa", 5, '"hay"')
    await _finished(db, "big", 20, '"needle"')
    await _finished(db, "qa-b", 2, '"hay"')
    await _finished(db, "qa", 3, '"needle a"')
    matches = await db.fetch(
        "SELECT id FROM jobq.all_jobs WHERE queue LIKE 'qa%' AND payload::text LIKE '%needle%'"
        " ORDER BY id DESC"
    )
    async with open_database(database_url) as jobq_db:
        found, before, pages, stops = [], None, 0, set()
        while True:
            page = await operators.list_jobs(
                jobq_db, search="needle", limit=2, before_id=before, scope=Grant([Role.VIEWER], ["qa*"]).like
            )
            pages += 1
            assert all(job["queue"] in ("qa", "qa-b") for job in page["jobs"])
            found += [job["id"] for job in page["jobs"]]
            stops.add(page["stopped_by"])
            before = page["next_before_id"]
            if before is None:
                break
            assert pages < 20
    assert found == [r["id"] for r in matches]
    assert "jobs" in stops  # a window ended a page short


def test_a_page_goes_no_lower_than_the_newest_end_of_its_windows():
    """Queue A's window ended at 90 (its jobs below were not read); queue B's matches below 90 wait for
    the next page, which starts at 90, and say why."""
    a_end = {"id": 90, "matched": False, "full_rows": True, "full_bytes": False}
    a_match = {"id": 95, "matched": True, "full_rows": False, "full_bytes": False}
    b = [{"id": i, "matched": True, "full_rows": False, "full_bytes": False} for i in (50, 40)]
    assert operators._page([a_match, a_end, *b], 2) == ([95], 90, "jobs")
    assert operators._page([a_match, {**a_end, "full_rows": False, "full_bytes": True}, *b], 2) == (
        [95],
        90,
        "bytes",
    )
    assert operators._page([a_match, *b], 2) == ([95, 50], 50, None)  # full: goes on below its last
    assert operators._page([a_match, *b], 5) == ([95, 50, 40], None, None)  # nothing older left


async def test_a_scope_that_admits_no_queue_lists_nothing(database_url, db):
    await _finished(db, "big", 3)
    async with open_database(database_url) as jobq_db:
        page = await operators.list_jobs(jobq_db, scope=Grant([Role.VIEWER], ["qa*"]).like)
    assert page == {"jobs": [], "next_before_id": None, "stopped_by": None}


async def test_a_search_reads_a_bounded_number_of_bytes_and_says_so(client, db, monkeypatch):
    """Jobs of 100 KB of text (stored compressed in a few KB: the bound is on the text a search reads): a
    search reads 300 KB of them a page (the job that reaches the bound is searched, none after it), the
    page says it stopped on bytes, and following next_before_id finds the match all the same. Small jobs
    keep the whole window of jobs."""
    monkeypatch.setattr(operators, "LIST_SCAN_BYTES", 300_000)
    needle = (await enqueue(client, "big", {"blob": "hay " * 25_000, "tag": "needle"}))["id"]
    hay = [(await enqueue(client, "big", {"blob": "hay " * 25_000}))["id"] for _ in range(9)]
    stored = await db.fetchval("SELECT max(pg_column_size(payload)) FROM jobq.jobs WHERE queue = 'big'")
    assert stored < 10_000
    first = await listed(client, q="needle")
    assert first["jobs"] == [] and first["stopped_by"] == "bytes"
    assert first["next_before_id"] == hay[-3]  # the three newest were searched
    pages, found, before = 0, [], None
    while True:
        page = await listed(client, q="needle", **({"before_id": before} if before else {}))
        pages += 1
        found += [job["id"] for job in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
    assert found == [needle] and pages == 4  # 10 jobs, 3 a page
    assert page["stopped_by"] is None
    for i in range(20):
        await enqueue(client, "small", {"n": i})
    small = await listed(client, q="needle", queue="small")
    assert small == {"jobs": [], "next_before_id": None, "stopped_by": None}
