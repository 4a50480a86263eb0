"""The peer: pgqueuer (Python, asyncpg) draining the same number of no-op jobs, in the same database."""

from __future__ import annotations

import time

import asyncpg
from pgqueuer import Queries, QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.domain.types import QueueExecutionMode


async def drain(dsn: str, jobs: int, batch: int) -> tuple[int, float]:
    setup = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(setup))
    if await setup.fetchval("SELECT to_regclass('pgqueuer') IS NULL"):
        await queries.install()
    await setup.execute("TRUNCATE pgqueuer, pgqueuer_log")
    for start in range(0, jobs, 1000):
        n = min(1000, jobs - start)
        await queries.enqueue(["noop"] * n, [b"{}"] * n, [0] * n)
    await setup.close()

    conn = await asyncpg.connect(dsn)
    manager = QueueManager(Queries(AsyncpgDriver(conn)))
    done = 0

    @manager.entrypoint("noop")
    async def noop(job: object) -> None:
        nonlocal done
        done += 1

    started = time.perf_counter()
    await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
    elapsed = time.perf_counter() - started
    await conn.close()
    return done, elapsed
