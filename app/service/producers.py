"""Producers' operations: enqueue jobs (one, or a batch all or nothing), read a job (or wait for it to
finish), cancel one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import orjson

from app.core.errors import JobqError, NotFound
from app.core.jsontext import WRITE_OPTIONS, written
from app.core.states import FINISHED
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import NewJobLike
from app.service.coalesce import Shared
from app.service.idempotency import (
    Once,
    as_answered_jobs,
    claim,
    enqueue_once,
    enqueue_singles_once,
    keep,
    keyed,
)
from app.service.inserts import encode_payloads, insert_deduplicated, insert_new, insert_waiting, linked
from app.service.rows import Row, Scope, as_job, run_guarded
from app.service.runtime import Runtime
from app.telemetry import tracing


async def enqueue(runtime: Runtime, job: NewJobLike, once: Once | None = None, scope: Scope = None) -> Row:
    """Enqueue one job, sharing its INSERT with concurrent single enqueues. A shared statement PostgreSQL
    refused is retried call by call, so each call still succeeds or fails on its own
    (app/service/coalesce.py). Enqueues with an idempotency key (`once`) share theirs with each other, so the
    others' statement stays ENQUEUE_NEW, with nothing of the keys. A job with parents is inserted on its
    own, and so is a debounced one (enqueue_batch); `scope` is for them (enqueue_batch)."""
    if job.depends_on is not None or job.debounce is not None:
        (row,) = await enqueue_batch(runtime, [job], once=once, scope=scope)
        return row
    if once is None:
        return await runtime.coalescing.submit(ENQUEUES, job)
    answer = await runtime.coalescing.submit(KEYED_ENQUEUES, (job, once))
    if isinstance(answer, JobqError):
        raise answer
    return answer


async def enqueue_batch(
    runtime: Runtime,
    requests: Sequence[NewJobLike],
    *,
    then: Callable[[asyncpg.Connection, Sequence[Row]], Awaitable[None]] | None = None,
    once: Once | None = None,
    payload_limit: int | None = None,
    scope: Scope = None,
) -> Sequence[Row]:
    """Insert jobs, all or nothing; each result carries `duplicate`.

    A dedup_key already held by an active job of the queue answers with that job. Within one batch, a
    repeated (queue, dedup_key) is a duplicate of its first occurrence. `then`, if given, runs in the
    same transaction with the jobs (the SQS API stores message attributes beside them this way, and
    FIFO messages their deduplication ids). With `once` (an idempotency key, see `Once`), the request is
    carried out at most once. `payload_limit`: the largest payload in bytes, encoded, for a caller that
    held its payloads to rules of its own (the SQS API: SQS's message size); None: JOBQ_MAX_PAYLOAD_BYTES.
    `scope`: the queues of the caller's token (None: all), which the parents it names must be in.
    """
    limit = runtime.settings.max_payload_bytes if payload_limit is None else payload_limit
    payloads = encode_payloads(requests, limit)
    if any(r.depends_on is not None or r.debounce is not None for r in requests):
        return await _enqueue_linked(runtime, requests, payloads, then, once, scope)
    if once is not None:
        if then is not None:
            raise TypeError("enqueue_batch: `then` and `once` do not go together")
        (answer,) = await enqueue_once(runtime, [keyed(requests, payloads, once)])
        if isinstance(answer, JobqError):
            raise answer
        return answer
    started = time.time_ns()
    if all(r.dedup_key is None for r in requests):
        async with runtime.db.acquire() as conn:
            if then is None:
                new = await insert_new(conn, requests, payloads)
            else:
                async with conn.transaction():
                    new = await insert_new(conn, requests, payloads)
                    await then(conn, new)
        runtime.metrics.enqueued.count_queues(new.queues)
        tracing.record("send", new, started)
        return new

    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            answers, results = await insert_deduplicated(conn, requests, payloads)
            if then is not None:
                await then(conn, results)
    inserted = [row for row in results if not row["duplicate"]]
    runtime.metrics.enqueued.count(inserted)
    tracing.record("send", inserted, started)
    return answers


async def _enqueue_linked(
    runtime: Runtime,
    requests: Sequence[NewJobLike],
    payloads: list[str],
    then: Callable[[asyncpg.Connection, Sequence[Row]], Awaitable[None]] | None,
    once: Once | None,
    scope: Scope,
) -> Sequence[Row]:
    """Jobs with parents (waiting, linked to them) or debounce (landing in their key's pending job), in a
    transaction of their own. Their answers depend on more than the request (a parent's end, a debounced
    job's state), so an Idempotency-Key keeps each answer whole (claim, keep) rather than rebuilding it."""
    started = time.time_ns()

    async def make(conn: asyncpg.Connection) -> tuple[Sequence[Row], bool]:
        if once is not None:
            kept = await claim(
                conn, once, keyed(requests, payloads, once).digest, runtime.settings.idempotency_ttl
            )
            if kept is not None:
                return as_answered_jobs(kept), True
        if any(r.debounce is not None for r in requests):
            rows = [await _enqueue_one(conn, r, p, scope) for r, p in zip(requests, payloads, strict=True)]
        else:
            rows = await insert_waiting(conn, requests, payloads, scope=scope)
        if then is not None:
            await then(conn, rows)
        if once is not None:
            answer = orjson.dumps(rows, option=WRITE_OPTIONS, default=written).decode()
            await keep(conn, once, answer, [row["id"] for row in rows])
        return rows, False

    rows, replayed = await linked(runtime.db, make)
    if replayed:
        return rows
    made = [row for row in rows if not row.get("debounced")]
    runtime.metrics.enqueued.count(made)
    tracing.record("send", made, started)
    return rows


async def _enqueue_one(conn: asyncpg.Connection, request: NewJobLike, payload: str, scope: Scope) -> Row:
    """One job of a batch that has debounced jobs, in the batch's transaction: a debounced one lands in its
    key's pending job (or makes one), any other is inserted alone; each answer says `debounced`."""
    debounce = request.debounce
    if debounce is None:
        if request.depends_on is not None:
            (row,) = await insert_waiting(conn, [request], [payload], scope=scope)
        else:
            row = (await insert_new(conn, [request], [payload]))[0]
        return row | {"debounced": False}
    row = await conn.fetchrow(
        q.ENQUEUE_DEBOUNCED.text,
        *q.ENQUEUE_DEBOUNCED.args(
            queue=request.queue,
            payload=payload,
            priority=request.priority or None,
            seconds=debounce.seconds,
            max_seconds=debounce.max_seconds,
            max_attempts=request.max_attempts,
            kind=request.kind,
            job_key=request.key,
            traceparent=request.traceparent,
            tracestate=request.tracestate,
            debounce_key=debounce.key,
        ),
    )
    return as_job(row) | {"duplicate": False}


ENQUEUES = Shared("enqueue", enqueue_batch)
KEYED_ENQUEUES = Shared("enqueue_once", enqueue_singles_once)


async def get_job(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_JOB.text, *q.GET_JOB.args(id=job_id, scope=scope))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return as_job(row)


async def wait_for_job(
    runtime: Runtime,
    job_id: int,
    wait: float,
    scope: Scope = None,
    disconnected: Callable[[], Awaitable[object]] | None = None,
) -> Row:
    """The job once it is finished (completed, dead or cancelled), or as it is when `wait` seconds pass
    (or its client goes, or the service is closing): the caller reads its status.

    Nothing polls. The waiter registers in this process (Wakeups.watching), then marks the job awaited
    (WATCH_JOB), and sleeps, holding no connection, until the statement that finishes the job, on
    whichever replica, notifies its id at commit; then it reads the job. A job already finished (or
    unknown: 404) is answered at once. At most `max_waiters` long-polls wait at once per process.
    """
    db, wakeups = runtime.db, runtime.wakeups
    with wakeups.long_poll():
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        deadline = time.monotonic() + wait
        try:
            while not wakeups.closing:
                with wakeups.watching(job_id) as waiter:
                    if not await _watch(runtime, job_id, scope):
                        break  # finished, or no such job: read it
                    await waiter.wait(deadline - time.monotonic(), gone)
                    if not waiter.woken:
                        break  # time is up, or the client left
                job = await get_job(db, job_id, scope)
                if job["status"] in FINISHED or time.monotonic() >= deadline:
                    return job
                # Woken, yet not finished: the listener reconnected (every waiter looks once). Again.
        finally:
            if gone is not None:
                gone.cancel()
    return await get_job(db, job_id, scope)


async def _watch(runtime: Runtime, job_id: int, scope: Scope) -> bool:
    """Mark the job awaited; False when it is finished, unknown or out of scope. Concurrent waiters
    share WATCH_JOBS statements (per scope, WATCHES); a job that one passed over, its row busy, is marked
    alone, as every job is with JOBQ_COALESCE off."""
    if await runtime.coalescing.submit(WATCHES, job_id, None if scope is None else tuple(scope)):
        return True
    async with runtime.db.acquire() as conn:
        return await conn.fetchval(q.WATCH_JOB.text, *q.WATCH_JOB.args(id=job_id, scope=scope)) is not None


async def _watch_shared(runtime: Runtime, scope: tuple[str, ...] | None, ids: list[int]) -> list[bool]:
    async with runtime.db.acquire() as conn:
        rows = await conn.fetch(
            q.WATCH_JOBS.text, *q.WATCH_JOBS.args(ids=ids, scope=None if scope is None else list(scope))
        )
    marked = {row["id"] for row in rows}
    return [job_id in marked for job_id in ids]


async def _not_shared(runtime: Runtime, scope: tuple[str, ...] | None, job_id: int) -> bool:
    """Nothing marked: with JOBQ_COALESCE off, _watch marks each job alone."""
    return False


# Per scope, and only while waiters are in it (a scope is a token's queues).
WATCHES = Shared("watch", _watch_shared, per_key=True, alone=_not_shared)


async def cancel(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await run_guarded(conn, q.CANCEL, job_id, scope, "pending and waiting jobs can be cancelled")
    return as_job(row)
