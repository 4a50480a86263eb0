"""The raw-SQL references: the same work done with bare asyncpg, over TCP, no HTTP. These are the
limits jobq is measured against."""

from __future__ import annotations

import asyncio
import time

import asyncpg

# The smallest correct claim: ready jobs in order, SKIP LOCKED, marked running in the same statement.
# The ids are gathered into an array first (an initplan, run once): as `id IN (subquery)`, on statistics
# taken while the table was empty, PostgreSQL planned a nested loop over every job of the table that ran
# the subquery once per job, and a drain of 100,000 jobs did not end in 20 minutes.
CLAIM = """
    UPDATE jobq.jobs j SET status = 'running', attempts = j.attempts + 1,
        lease_token = gen_random_uuid(), lease_expires_at = now() + interval '30 seconds'
    WHERE j.id = ANY(ARRAY(
        SELECT id FROM jobq.jobs WHERE queue = $1 AND status = 'pending' AND run_at <= now()
        ORDER BY priority, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING j.id, j.payload, j.lease_token
"""
ACK = """
    UPDATE jobq.jobs SET status = 'completed', completed_at = now()
    WHERE id = ANY($1::bigint[]) AND status = 'running'
"""
INSERT_ONE = "INSERT INTO jobq.jobs (queue, payload) VALUES ($1, $2::jsonb) RETURNING id"
INSERT_MANY = """
    INSERT INTO jobq.jobs (queue, payload)
    SELECT $1, p::jsonb FROM unnest($2::text[]) AS p RETURNING id
"""


async def ensure_queue(conn: asyncpg.Connection, queue: str) -> None:
    await conn.execute("INSERT INTO jobq.queues (name) VALUES ($1) ON CONFLICT DO NOTHING", queue)


async def connect(dsn: str, n: int) -> list[asyncpg.Connection]:
    return list(await asyncio.gather(*(asyncpg.connect(dsn) for _ in range(n))))


async def close(conns: list[asyncpg.Connection]) -> None:
    await asyncio.gather(*(c.close() for c in conns))


async def drain(dsn: str, queue: str, workers: int, batch: int) -> tuple[int, float]:
    """Claim `batch` and ack them in one statement each, on `workers` connections, until empty."""
    conns = await connect(dsn, workers)
    done = 0

    async def work(conn: asyncpg.Connection) -> None:
        nonlocal done
        while rows := await conn.fetch(CLAIM, queue, batch):
            await conn.execute(ACK, [r["id"] for r in rows])
            done += len(rows)

    started = time.perf_counter()
    await asyncio.gather(*(work(c) for c in conns))
    elapsed = time.perf_counter() - started
    await close(conns)
    return done, elapsed


async def drain_count(dsn: str, queue: str, workers: int, batch: int, total: int) -> None:
    """Claim and ack until `total` jobs are done, polling every millisecond when none is ready."""
    conns = await connect(dsn, workers)
    done = 0

    async def work(conn: asyncpg.Connection) -> None:
        nonlocal done
        while done < total:
            rows = await conn.fetch(CLAIM, queue, batch)
            if not rows:
                await asyncio.sleep(0.001)
                continue
            await conn.execute(ACK, [r["id"] for r in rows])
            done += len(rows)

    await asyncio.gather(*(work(c) for c in conns))
    await close(conns)


async def enqueue_single(dsn: str, queue: str, clients: int, total: int, payload: str) -> float:
    """`total` single-row inserts from `clients` connections; seconds taken."""
    conns = await connect(dsn, clients)
    await ensure_queue(conns[0], queue)
    left = total

    async def work(conn: asyncpg.Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await conn.fetchval(INSERT_ONE, queue, payload)

    started = time.perf_counter()
    await asyncio.gather(*(work(c) for c in conns))
    elapsed = time.perf_counter() - started
    await close(conns)
    return elapsed


async def enqueue_batches(dsn: str, queue: str, batch: int, total: int, payload: str) -> float:
    """`total` rows in inserts of `batch` rows on one connection; seconds taken."""
    (conn,) = await connect(dsn, 1)
    await ensure_queue(conn, queue)
    payloads = [payload] * batch
    started = time.perf_counter()
    for _ in range(total // batch):
        await conn.fetch(INSERT_MANY, queue, payloads)
    elapsed = time.perf_counter() - started
    await conn.close()
    return elapsed
