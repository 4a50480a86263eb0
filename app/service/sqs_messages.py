"""What SQS's message actions (app/sqs/) keep and read beside jobq's own operations: a message is a job
(SendMessage enqueues it, ReceiveMessage leases it, DeleteMessage acks it), with its message attributes
stored in the job's row, and a receipt handle that names the job and its lease token."""

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
from app.service.rows import Row
from app.service.runtime import Runtime
from app.service.sqs_fifo import Keep


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
