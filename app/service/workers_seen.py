"""Workers seen: which `worker_id` leased from which queue, and when last.

Every `POST /lease` that names its worker (the Python runner sends `host:pid`) is noted in this process's
memory (``Sightings.saw``, app/service/sightings.py: a dict update, no I/O). Every few seconds each replica
writes what it noted since its last write in one statement (SEE_WORKERS), so the table holds every
replica's workers at the cost of one small write per replica per interval, whatever the lease rate. A
lease with no worker_id is not noted. Rows not seen for WORKERS_KEPT are deleted by the pruning loop.
What a worker holds now is not kept here: `list_workers` counts the running jobs leased under its id.
"""

from __future__ import annotations

from datetime import UTC, datetime

from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row, Scope
from app.service.runtime import Runtime

WORKERS_KEPT = 3600.0  # seconds a worker stays listed after it was last seen
WORKERS_SHOWN = 500  # at most, most recently seen first


async def write_sightings(runtime: Runtime) -> int:
    """Write what this process saw since its last write; how many (worker, queue) rows it wrote. Sorted,
    so replicas writing the same rows at once lock them in the same order."""
    seen = sorted(runtime.sightings.take().items())
    if not seen:
        return 0
    args = q.SEE_WORKERS.args(
        worker_ids=[worker for (worker, _), _ in seen],
        queues=[queue for (_, queue), _ in seen],
        last_seen=[datetime.fromtimestamp(at, UTC) for _, (at, _) in seen],
        leased=[int(n) for _, (_, n) in seen],
    )
    async with runtime.db.acquire() as conn:
        await conn.execute(q.SEE_WORKERS.text, *args)
    return len(seen)


async def forget_workers(db: Database) -> int:
    """Delete workers not seen for WORKERS_KEPT seconds; how many rows went."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.FORGET_WORKERS.text, *q.FORGET_WORKERS.args(kept=WORKERS_KEPT))
    return len(rows)


async def list_workers(db: Database, scope: Scope = None) -> list[Row]:
    """Workers seen in the last WORKERS_KEPT seconds, and any holding a job: the queues each leased from,
    when last seen, jobs leased, jobs held now (running under its id) and the soonest of their lease
    deadlines; most recently seen first."""
    async with db.acquire_read() as conn:
        rows = await conn.fetch(q.LIST_WORKERS.text, *q.LIST_WORKERS.args(scope=scope, limit=WORKERS_SHOWN))
    return [dict(r) for r in rows]
