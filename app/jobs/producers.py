"""Producers' operations: enqueue jobs (one, or a batch all or nothing), read a job, cancel one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from app import queries as q
from app.db import Database
from app.errors import JobqError, NotFound
from app.jobs.arguments import NewJobLike
from app.jobs.idempotency import Once, enqueue_once, enqueue_singles_once, keyed
from app.jobs.inserts import encode_payloads, insert_deduplicated, insert_new
from app.jobs.rows import Row, Scope, as_job, run_guarded
from app.jobs.shared import shared


async def enqueue(db: Database, job: NewJobLike, once: Once | None = None) -> Row:
    """Enqueue one job, sharing its INSERT with concurrent single enqueues. A shared statement PostgreSQL
    refused is retried call by call, so each call still succeeds or fails on its own (app/coalesce.py).
    Enqueues with an idempotency key (`once`) share theirs with each other, so the others' statement
    stays ENQUEUE_NEW, with nothing of the keys."""
    if once is None:
        return await shared(db, "enqueue", enqueue_batch, job)
    answer = await shared(db, "enqueue_once", enqueue_singles_once, (job, once))
    if isinstance(answer, JobqError):
        raise answer
    return answer


async def enqueue_batch(
    db: Database,
    requests: Sequence[NewJobLike],
    *,
    then: Callable[[asyncpg.Connection, list[Row]], Awaitable[None]] | None = None,
    once: Once | None = None,
) -> list[Row]:
    """Insert jobs, all or nothing; each result carries `duplicate`.

    A dedup_key already held by an active job of the queue answers with that job. Within one batch, a
    repeated (queue, dedup_key) is a duplicate of its first occurrence. `then`, if given, runs in the
    same transaction with the jobs (the SQS API stores message attributes beside them this way).
    With `once` (an idempotency key, see `Once`), the request is carried out at most once.
    """
    payloads = encode_payloads(requests, db.settings.max_payload_bytes)
    if once is not None:
        if then is not None:
            raise TypeError("enqueue_batch: `then` and `once` do not go together")
        (answer,) = await enqueue_once(db, [keyed(requests, payloads, once)])
        if isinstance(answer, JobqError):
            raise answer
        return answer
    if all(r.dedup_key is None for r in requests):
        async with db.acquire() as conn:
            if then is None:
                new = await insert_new(conn, requests, payloads)
            else:
                async with conn.transaction():
                    new = await insert_new(conn, requests, payloads)
                    await then(conn, new)
        db.metrics.enqueued.count(new)
        return new

    async with db.acquire() as conn:
        async with conn.transaction():
            answers, results = await insert_deduplicated(conn, requests, payloads)
            if then is not None:
                await then(conn, results)
    db.metrics.enqueued.count([row for row in results if not row["duplicate"]])
    return answers


async def get_job(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_JOB.text, *q.GET_JOB.args(id=job_id, scope=scope))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return as_job(row)


async def cancel(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await run_guarded(conn, q.CANCEL, job_id, scope, "pending jobs can be cancelled")
    return as_job(row)
