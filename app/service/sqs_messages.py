"""What SQS's message actions (app/sqs/) keep and read beside jobq's own operations: a message is a job
(SendMessage enqueues it, ReceiveMessage leases it, DeleteMessage acks it), with its message attributes
stored in the job's row, and a receipt handle that names the job and its lease token.

A message whose visibility timeout has run out is visible at once, as in SQS, not when the lease-expiry
loop next returns its job (every JOBQ_EXPIRE_INTERVAL): a receive expires the leases of its queue that
have run out before it leases (``expire_overdue``), and GetQueueAttributes counts them as visible
(``counts``). The expiry is the loop's own, fenced as always: the old receipt handle deletes nothing once
another receive has taken the message."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from app.core.access import like
from app.core.tokens import parse_token
from app.db import sql as q
from app.db.pool import Database
from app.db.sql import sqs as sq
from app.service.arguments import NewJobLike
from app.service.producers import enqueue_batch
from app.service.redrive import move_dead_letters
from app.service.rows import Row
from app.service.runtime import Runtime
from app.service.sqs_fifo import Keep
from app.service.upkeep import expire_leases

MAX_WAIT = 20  # seconds: the longest WaitTimeSeconds of a receive, SQS's


async def insert_messages(
    runtime: Runtime,
    jobs: Sequence[NewJobLike],
    attributes: Sequence[dict[str, Any]],
    *,
    payload_limit: int,
    keep: Keep | None = None,
) -> list[Row]:
    """Insert messages as jobs, all or nothing, with their message attributes (`attributes`, one per job;
    empty: none) and `keep`, if given, in the same transaction. `payload_limit`: the largest payload a
    message within the queue's size limit makes."""
    with_attributes = [k for k, given in enumerate(attributes) if given]

    async def store(conn: asyncpg.Connection, rows: Sequence[Row]) -> None:
        if with_attributes:
            await conn.execute(
                sq.SET_MESSAGE_ATTRIBUTES.text,
                *sq.SET_MESSAGE_ATTRIBUTES.args(
                    ids=[rows[k]["id"] for k in with_attributes],
                    attributes=[json.dumps(attributes[k]) for k in with_attributes],
                ),
            )
        if keep is not None:
            await keep(conn, rows)

    return await enqueue_batch(
        runtime,
        jobs,
        then=store if with_attributes or keep is not None else None,
        payload_limit=payload_limit,
    )


async def expire_messages(db: Database, leased: list[Row], retention: float) -> set[int]:
    """Delete those of the leased messages sent more than `retention` seconds ago; their ids."""
    query = q.EXPIRE_MESSAGES
    args = query.args(
        ids=[j["id"] for j in leased],
        queues=[j["queue"] for j in leased],
        lease_tokens=[parse_token(j["lease_token"])[0] for j in leased],
        retention=retention,
    )
    async with db.acquire() as conn:
        return {r["id"] for r in await conn.fetch(query.text, *args)}


async def received(db: Database, ids: list[int]) -> dict[int, asyncpg.Record]:
    """What a receive answers beside the jobs, per job id: its message attributes and when it was first
    received (sq.RECEIVED)."""
    async with db.acquire() as conn:
        return {r["id"]: r for r in await conn.fetch(sq.RECEIVED.text, *sq.RECEIVED.args(ids=ids))}


async def elsewhere(db: Database, queue: str, ids: list[int]) -> set[int]:
    """Those of the jobs `ids` that are not in `queue`, looked up in one statement."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.JOB_QUEUES.text, *q.JOB_QUEUES.args(ids=ids))
    return {r["id"] for r in rows if r["queue"] != queue}


async def revive(db: Database, job_id: int, token: str, timeout: float) -> tuple[bool, str | None]:
    """REVIVE_LEASE: (True, None) when the lease of `token` is in force again, else (False, the job's
    status, None when there is no such job in the token's queue)."""
    lease, queue = parse_token(token)
    async with db.acquire() as conn:
        if queue is None:  # a token from before tokens named their queue
            row = await conn.fetchrow(q.JOB_QUEUES.text, *q.JOB_QUEUES.args(ids=[job_id]))
            queue = row["queue"] if row else None
        args = q.REVIVE_LEASE.args(id=job_id, queue=queue, lease_token=lease, visibility_timeout=timeout)
        if await conn.fetchrow(q.REVIVE_LEASE.text, *args) is not None:
            return True, None
        # The status of the job in the token's queue only: a token naming this queue with another
        # queue's job id must not tell whether that job is still running.
        scope = None if queue is None else [like(queue)]
        return False, await conn.fetchval(q.JOB_STATUS.text, *q.JOB_STATUS.args(id=job_id, scope=scope))


async def status(db: Database, job_id: int) -> str | None:
    """The job's status; None when there is no such job."""
    async with db.acquire() as conn:
        return await conn.fetchval(q.JOB_STATUS.text, *q.JOB_STATUS.args(id=job_id, scope=None))


async def receiving_queue(db: Database, name: str) -> asyncpg.Record | None:
    """The queue as SQS shows it (sq.QUEUE) and what a receive from it must do first (`overdue`, `due_in`
    within MAX_WAIT seconds, `dead`: sq.RECEIVE_DUE), read in one statement; None when there is none."""
    async with db.acquire() as conn:
        return await conn.fetchrow(
            sq.RECEIVING_QUEUE.text, *sq.RECEIVING_QUEUE.args(queue=name, within=float(MAX_WAIT))
        )


async def expire_overdue(
    runtime: Runtime, queue: str, dead_letter_queue: str | None, within: float, due: Any = None
) -> float | None:
    """Make ready what a receive from `queue` must find before it leases. The queue's leases that have
    run out are expired now (EXPIRE_LEASES, as the lease-expiry loop runs it, on `queue` alone), so that
    their messages are visible to this very receive. The queue's dead jobs (one this expiry took past
    maxReceiveCount, or one a nack left dead) move into `dead_letter_queue` (None: the queue has none)
    now (REDRIVE_DEAD), so that the receive that would exceed maxReceiveCount does not return the message
    but moves it, as SQS does. Returns the seconds until the queue's next lease runs out, when that is
    within `within` seconds (None otherwise): a long-poll looks again then, since the message is visible
    from then on.

    The move is the loop's own and acts on every queue with dead jobs to move, not on `queue` alone: what
    it does to other queues is what the loop would do within a second. Both run only when `queue` has a
    lease run out or a dead job to move, which one statement, RECEIVE_DUE, tells first, unless the caller
    read it already (`due`, with the queue: ``receiving_queue``)."""
    if due is None:
        args = sq.RECEIVE_DUE.args(queue=queue, dlq=dead_letter_queue, within=within)
        async with runtime.db.acquire() as conn:
            due = await conn.fetchrow(sq.RECEIVE_DUE.text, *args)
    dead = due["dead"]
    if due["overdue"]:
        expired = await expire_leases(runtime, queue)
        dead = dead or (
            dead_letter_queue is not None
            and any(row["queue"] == queue and row["status"] == "dead" for row in expired)
        )
    if dead:
        await move_dead_letters(runtime.db)
    return due["due_in"]


async def counts(db: Database, queue: str) -> Row:
    """The queue's messages as GetQueueAttributes counts them (sq.SQS_COUNTS), under QUEUE_STATS's names:
    `pending` (visible, a lease that has run out among them), `running` (in flight), `scheduled`
    (delayed)."""
    async with db.acquire() as conn:
        row = await conn.fetchrow(sq.SQS_COUNTS.text, *sq.SQS_COUNTS.args(queue=queue))
    return dict(row)
