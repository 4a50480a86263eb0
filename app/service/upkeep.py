"""What the background loops (app/service/loops/background.py) run: lease expiry, and the database's numbers
for the metrics (app/telemetry/metrics.py). Finished jobs' retention is in app/service/history.py, idempotency
keys' in app/service/idempotency.py, with the rest of their life."""

from __future__ import annotations

import time

from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row
from app.service.runtime import Runtime
from app.telemetry import tracing
from app.telemetry.metrics import DatabaseHealth

EXPIRE_BATCH = 1000  # leases per EXPIRE_LEASES statement


async def expire_leases(runtime: Runtime, queue: str | None = None) -> list[Row]:
    """Return every expired lease (of `queue` only, when given) to pending (or dead); the jobs changed."""
    changed: list[Row] = []
    started = time.time_ns()
    async with runtime.db.acquire() as conn:
        while True:
            args = q.EXPIRE_LEASES.args(batch=EXPIRE_BATCH, queue=queue)
            rows = await conn.fetch(q.EXPIRE_LEASES.text, *args)
            changed.extend(dict(r) for r in rows)
            if len(rows) < EXPIRE_BATCH:
                break
    runtime.metrics.expired.count(changed)
    dead = [r for r in changed if r["status"] == "dead"]
    runtime.metrics.dead_lettered.count(dead)
    tracing.record("dead-letter", dead, started)
    return changed


async def prune_in_batches(db: Database, prune: q.Query, **args: object) -> int:
    """Run a pruning statement (a DELETE of at most :batch rows, with `args` for its other parameters)
    until a batch comes back short; how many rows went. The connection is released between batches:
    pruning never starves requests."""
    batch, total = db.settings.prune_batch, 0
    while True:
        async with db.acquire() as conn:
            tag = await conn.execute(prune.text, *prune.args(batch=batch, **args))
        deleted = int(tag.split()[-1])  # the command tag: "DELETE <rows>"
        total += deleted
        if deleted < batch:
            return total


async def queue_gauges(db: Database) -> list[Row]:
    """Per queue: paused, pending, scheduled, running, dead and lag_seconds (for the metrics)."""
    async with db.acquire_read() as conn:
        return [dict(r) for r in await conn.fetch(q.QUEUE_GAUGES.text)]


async def lock_waits(db: Database) -> Row:
    """Sessions of this database waiting for a lock: `waiting`, and `longest_seconds`."""
    async with db.acquire() as conn:
        return dict(await conn.fetchrow(q.LOCK_WAITS.text))


async def database_health(db: Database) -> DatabaseHealth:
    """What holds back vacuum of jobq's tables, and the jobs table's state, read on the primary."""
    async with db.acquire() as conn:
        horizon = [dict(r) for r in await conn.fetch(q.VACUUM_HORIZON.text)]
        table = await conn.fetchrow(q.TABLE_HEALTH.text)
    return DatabaseHealth(horizon, dict(table) if table is not None else None)
