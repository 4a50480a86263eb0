"""Operators' operations: job lists, dead jobs (retry, purge), jobs picked by hand (cancel, run now, a
selection or every job a list matches at once), and queues (list, read, configure, pause)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg

from app.core.errors import NotFound
from app.core.limits import MAX_JOB_ID
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import QueueSettingsLike
from app.service.push import set_push
from app.service.rows import Row, Scope, as_job, run_guarded
from app.service.runtime import Runtime

# Keyset paging starts below this: every job.
PAST_LAST_ID = MAX_JOB_ID + 1
RETRY_BATCH = 1000  # dead jobs per RETRY_DEAD statement


# --- dead jobs -------------------------------------------------------------------------------------


async def dead_jobs(
    db: Database, queue: str | None, limit: int, before_id: int | None, scope: Scope = None
) -> Row:
    """Dead jobs of `queue`, or of every queue in `scope` (the caller has checked `queue` against it)."""
    before = before_id if before_id is not None else PAST_LAST_ID
    async with db.acquire_read() as conn:
        if queue is None:
            query, args = q.DEAD_JOBS, q.DEAD_JOBS.args(before_id=before, limit=limit, scope=scope)
        else:
            query, args = (
                q.DEAD_JOBS_IN_QUEUE,
                q.DEAD_JOBS_IN_QUEUE.args(queue=queue, before_id=before, limit=limit),
            )
        rows = await conn.fetch(query.text, *args)
        if queue is not None and not rows:
            await _known_queue(conn, queue)
    jobs = [as_job(r) for r in rows]
    return {"jobs": jobs, "next_before_id": jobs[-1]["id"] if len(jobs) == limit else None}


# What one page of GET /jobs reads at most, whatever its filters (app/db/sql/lists.py LIST_WINDOW): jobs, and
# for a search, bytes of their text (2 MiB, each job counting 256 bytes at least: 8,192 small jobs, or
# twenty of 100 KB). A page read queue by queue (a token's scope) shares both among its queues.
LIST_SCAN = 10_000
LIST_SCAN_BYTES = 2 * 1024 * 1024


def _like_pattern(text: str) -> str:
    """`text` anywhere, as an ILIKE pattern: its own %, _ and backslashes match themselves."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _share(total: int, queues: list[str] | None) -> int:
    return -(-total // len(queues)) if queues else total


def _page(seen: list[Mapping[str, Any]], limit: int) -> tuple[list[int], int | None, str | None]:
    """A page's ids, where the next starts and what stopped it short, from its windows (LIST_WINDOW): the
    matches of each, and the last row of each that ended before its jobs did. Below the newest such end,
    a queue that ended there was not read, so matches of the other queues from there on wait for the next
    page; above it, every queue was read to the end of its window or to its `limit` matches."""
    ends = {
        r["id"]: "bytes" if r["full_bytes"] else "jobs" for r in seen if r["full_rows"] or r["full_bytes"]
    }
    cut = max(ends, default=None)
    ids = sorted((r["id"] for r in seen if r["matched"] and (cut is None or r["id"] >= cut)), reverse=True)
    ids = ids[:limit]
    if len(ids) == limit:
        return ids, ids[-1], None
    if cut is None:
        return ids, None, None
    return ids, cut, ends[cut]


async def list_window(
    conn: asyncpg.Connection,
    *,
    queue: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    key: str | None = None,
    search: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
    scope: Scope = None,
) -> tuple[q.Query, list[Any]] | None:
    """The statement that reads a page's window (LIST_WINDOW), with its arguments; None for a `scope`
    that admits no queue. With `scope` and no `queue`, the scope's queues are read one by one, each
    through its (queue, id) index with its share of the bounds, so no other queue's job is read."""
    queues = [queue] if queue is not None else None
    if queues is None and scope is not None:
        queues = await conn.fetchval(q.SCOPE_QUEUES.text, *q.SCOPE_QUEUES.args(scope=scope))
        if not queues:
            return None
    window = q.LIST_WINDOW[q.list_filters(queues is not None, status, search is not None)]
    values: dict[str, Any] = {
        "before_id": before_id if before_id is not None else PAST_LAST_ID,
        "scan": _share(LIST_SCAN, queues),
        "kind": kind,
        "key": key,
        "limit": limit,
    }
    if search is not None:
        values["pattern"] = _like_pattern(search)
        # The bytes as units of q.BYTE_UNIT, a unit at least (a job).
        values["units"] = max(1, _share(LIST_SCAN_BYTES, queues) // q.BYTE_UNIT)
    if queues is not None:
        values["queues"] = queues
    if status is not None:
        values["status"] = status
    return window, window.args(**values)


async def list_jobs(
    db: Database,
    *,
    queue: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    key: str | None = None,
    search: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
    scope: Scope = None,
) -> Row:
    """Jobs of any state, newest first, a page at a time: `next_before_id` goes on below the page. A page
    reads at most LIST_SCAN jobs of the queue and status (and a search LIST_SCAN_BYTES of them), so one
    with a rare kind, key or search may come back short (even empty) with a `next_before_id` all the
    same, and `stopped_by` saying which bound ended it; null only once nothing older is left. The caller
    has checked `queue` against `scope`."""
    # One snapshot for every statement: a job enqueued meanwhile does not move the window's end.
    async with db.acquire_read() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        window = await list_window(
            conn,
            queue=queue,
            status=status,
            kind=kind,
            key=key,
            search=search,
            limit=limit,
            before_id=before_id,
            scope=scope,
        )
        if window is None:
            return {"jobs": [], "next_before_id": None, "stopped_by": None}
        seen = await conn.fetch(window[0].text, *window[1])
        if queue is not None and not seen and before_id is None:
            await _known_queue(conn, queue)
        ids, after, stopped = _page(seen, limit)
        page = q.LIST_PAGE[q.list_filters(False, status, False)[1]]
        rows = await conn.fetch(page.text, *page.args(ids=ids)) if ids else []
    return {"jobs": [as_job(r) for r in rows], "next_before_id": after, "stopped_by": stopped}


async def retry_dead(db: Database, ids: list[int] | None, queue: str | None, scope: Scope = None) -> Row:
    """Dead jobs back to pending, a page at a time; those whose dedup_key is taken are skipped, those
    outside `scope` are left alone (not counted, as jobs that are not dead)."""
    retried, skipped = 0, []
    before = PAST_LAST_ID
    async with db.acquire() as conn:
        while True:
            try:
                rows = await conn.fetch(
                    q.RETRY_DEAD.text,
                    *q.RETRY_DEAD.args(
                        before_id=before, ids=ids, queue=queue, scope=scope, batch=RETRY_BATCH
                    ),
                )
            except asyncpg.UniqueViolationError:
                continue  # an enqueue took a key between our check and update: look again
            for r in rows:
                if r["retried"]:
                    retried += 1
                else:
                    skipped.append(r["id"])
            if len(rows) < RETRY_BATCH:
                break
            before = rows[-1]["id"]
        if queue is not None and not retried and not skipped:
            await _known_queue(conn, queue)
    return {"retried": retried, "skipped": skipped}


async def purge_dead_jobs(db: Database, ids: list[int], scope: Scope = None) -> list[int]:
    """Purge those of `ids` that are dead (and in scope); the ids purged."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.PURGE_DEAD_JOBS.text, *q.PURGE_DEAD_JOBS.args(ids=ids, scope=scope))
    return [r["id"] for r in rows]


async def cancel_jobs(db: Database, ids: list[int], scope: Scope = None) -> list[int]:
    """Cancel those of `ids` that are pending (and in scope); the ids cancelled."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.CANCEL_JOBS.text, *q.CANCEL_JOBS.args(ids=ids, scope=scope))
    return [r["id"] for r in rows]


async def run_now(db: Database, job_id: int, scope: Scope = None) -> Row:
    """A pending job that waits for its run_at (scheduled, or backing off before a retry), ready now."""
    async with db.acquire() as conn:
        row = await run_guarded(conn, q.RUN_NOW, job_id, scope, "a job not due yet can be run now")
    return as_job(row)


MATCHING_PAGE = 500  # ids per step of every_match


async def every_match(
    db: Database,
    *,
    queue: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    key: str | None = None,
    search: str | None = None,
    scope: Scope = None,
) -> AsyncIterator[list[int]]:
    """The ids of every job `list_jobs` finds with these filters, newest first, a page at a time: the
    dashboard's "retry/purge/cancel all matching". The caller may change each page's jobs before asking
    for the next, which starts below it."""
    before_id = None
    while True:
        page = await list_jobs(
            db,
            queue=queue,
            status=status,
            kind=kind,
            key=key,
            search=search,
            limit=MATCHING_PAGE,
            before_id=before_id,
            scope=scope,
        )
        if page["jobs"]:
            yield [job["id"] for job in page["jobs"]]
        before_id = page["next_before_id"]
        if before_id is None:
            return


def _no_queue(name: str) -> NotFound:
    return NotFound(f"queue {name!r} does not exist (no jobs, no settings)")


async def _known_queue(conn: asyncpg.Connection, queue: str) -> None:
    """NotFound for a queue with no row (never used, or deleted): a filter naming it is a mistake worth
    saying, not an empty answer."""
    if not await conn.fetchval(q.QUEUE_EXISTS.text, *q.QUEUE_EXISTS.args(queue=queue)):
        raise _no_queue(queue)


async def purge_dead(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        await run_guarded(conn, q.PURGE_DEAD, job_id, scope, "dead jobs can be purged")
    return {"id": job_id, "purged": True}


# --- queues ----------------------------------------------------------------------------------------

_SETTINGS = ("visibility_timeout", "max_attempts", "backoff_base", "backoff_cap", "retention")
_FLOW_COLUMNS = ("key_concurrency", "fair", "rate_limit", "rate_period", "key_rate_limit", "key_rate_period")


def _rate(limit: int | None, period: float | None) -> Row | None:
    return None if limit is None else {"limit": limit, "period": period}


def _queue_row(row: asyncpg.Record, with_settings: bool) -> Row:
    out = {k: v for k, v in row.items() if k not in _SETTINGS and k not in _FLOW_COLUMNS}
    if out.get("push") is not None:
        out["push"] = json.loads(out["push"])
    if with_settings:
        out["settings"] = {k: row[k] for k in _SETTINGS} | {
            "key_concurrency": row["key_concurrency"],
            "fair": row["fair"],
            "rate": _rate(row["rate_limit"], row["rate_period"]),
            "key_rate": _rate(row["key_rate_limit"], row["key_rate_period"]),
        }
    return out


async def queues(db: Database, scope: Scope = None) -> list[Row]:
    """Every queue's row, or those of the queues in `scope`."""
    async with db.acquire_read() as conn:
        rows = await conn.fetch(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=None, scope=scope))
    return [_queue_row(r, with_settings=False) for r in rows]


async def _queue_stats(conn: asyncpg.Connection, name: str) -> asyncpg.Record:
    row = await conn.fetchrow(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=name, scope=None))
    if row is None:
        raise _no_queue(name)
    return row


async def queue(db: Database, name: str) -> Row:
    async with db.acquire() as conn:
        return _queue_row(await _queue_stats(conn, name), with_settings=True)


async def queue_cancelled(db: Database, name: str) -> int:
    """How many of the queue's jobs were cancelled and are kept still (for its retention)."""
    async with db.acquire_read() as conn:
        return await conn.fetchval(q.QUEUE_CANCELLED.text, *q.QUEUE_CANCELLED.args(queue=name))


async def configure_queue(runtime: Runtime, name: str, settings: QueueSettingsLike) -> Row:
    """Change the settings given (None keeps one; among flow-control settings, absent keeps one and None
    clears it), creating the queue if need be; the queue's row. A change of flow control reaches every
    replica's claims at once (sql.SET_FLOW)."""
    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            await conn.execute(
                q.CONFIGURE_QUEUE.text,
                *q.CONFIGURE_QUEUE.args(
                    queue=name,
                    visibility_timeout=settings.visibility_timeout,
                    max_attempts=settings.max_attempts,
                    backoff_base=settings.backoff_base,
                    backoff_cap=settings.backoff_cap,
                    retention=settings.retention,
                ),
            )
            if settings.flow:
                flow = json.dumps(settings.flow)
                await conn.execute(q.CONFIGURE_FLOW.text, *q.CONFIGURE_FLOW.args(queue=name, flow=flow))
                await conn.execute(q.SET_FLOW.text, *q.SET_FLOW.args(queue=name))
            made = await set_push(runtime, conn, name, settings.push) if settings.push_set else None
        if settings.flow:
            runtime.flow.forget(name)
        row = _queue_row(await _queue_stats(conn, name), with_settings=True)
        if made is not None:
            row["push_secret"] = made
        return row


async def set_paused(db: Database, name: str, paused: bool) -> Row:
    async with db.acquire() as conn:
        await conn.execute(q.SET_PAUSED.text, *q.SET_PAUSED.args(queue=name, paused=paused))
        return _queue_row(await _queue_stats(conn, name), with_settings=False)
