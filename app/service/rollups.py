"""Rollups: per queue and minute, jobs enqueued, completed, failed and dead, and the longest lag seen;
what the dashboard's charts draw.

Nothing is written per job. Each replica already counts these events per queue in memory (its Prometheus
counters, app/telemetry/metrics.py); every metrics interval it adds what they counted since its last write to
the current minute's rows, in one statement (ROLL_UP), with the lag its gauges just read. So the rows are the
sum over every replica, and a replica that stops writes its last counts on the way out (``write_rollups`` from
the app's shutdown). A replica that is killed loses at most one interval of counts. Jobs enqueued with the SQL
function `jobq.enqueue()` pass no replica and are not in `enqueued` (their lag is).

Charts read the rows in steps (``rollup_series``): a minute for the last hour, 15 minutes for the last day, 2
hours for the last week. Rows older than ROLLUPS_KEPT are deleted by the pruning loop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row, Scope
from app.service.runtime import Runtime
from app.service.tally import SERIES

ROLLUPS_KEPT = 8 * 86400.0  # seconds: a week of charts, and a day to spare
# What a chart can show: its span and the step of its points, both in seconds.
SPANS = {"1h": (3600, 60), "1d": (86400, 900), "7d": (7 * 86400, 7200)}
# Where the steps of a chart start counting: ROLLUP_SERIES bins minutes from it, and a page lays its
# steps out from it, so both agree on every step's start.
ROLLUP_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)


def _totals(runtime: Runtime) -> dict[str, dict[str, float]]:
    m = runtime.metrics
    failed = m.nacked.totals()
    for queue, n in m.expired.totals().items():
        failed[queue] = failed.get(queue, 0) + n
    return {
        "enqueued": m.enqueued.totals(),
        "completed": m.acked.totals(),
        "failed": failed,
        "dead": m.dead_lettered.totals(),
    }


async def write_rollups(runtime: Runtime) -> int:
    """Add this replica's counts since its last write, and the lag its gauges last read, to the current
    minute of each queue; how many rows it wrote."""
    totals = _totals(runtime)
    counts = runtime.rollups.since(totals)
    lags = {row["queue"]: row["lag_seconds"] for row in runtime.metrics.gauges.queues}
    queues = sorted(counts.keys() | lags.keys())  # sorted: replicas writing at once lock in one order
    if not queues:
        return 0
    zero = dict.fromkeys(SERIES, 0)
    columns: dict[str, Any] = {series: [counts.get(qn, zero)[series] for qn in queues] for series in SERIES}
    async with runtime.db.acquire() as conn:
        await conn.execute(
            q.ROLL_UP.text, *q.ROLL_UP.args(queues=queues, lags=[lags.get(qn) for qn in queues], **columns)
        )
    runtime.rollups.written(totals)
    return len(queues)


async def forget_rollups(db: Database) -> None:
    async with db.acquire() as conn:
        await conn.execute(q.FORGET_ROLLUPS.text, *q.FORGET_ROLLUPS.args(kept=ROLLUPS_KEPT))


async def rollup_series(db: Database, queue: str, span: str) -> list[Row]:
    """The queue's rollups over `span` (a key of SPANS), a row per step that has any: its start (`at`),
    each series' sum and the longest lag in it."""
    seconds, step = SPANS[span]
    async with db.acquire_read() as conn:
        rows = await conn.fetch(
            q.ROLLUP_SERIES.text,
            *q.ROLLUP_SERIES.args(queue=queue, span=seconds, step=step, origin=ROLLUP_ORIGIN),
        )
    return [dict(r) for r in rows]


async def completed_lately(db: Database, scope: Scope = None, span: float = 3600.0) -> dict[str, int]:
    """Each queue's jobs completed in the last `span` seconds (an hour), as the rollups have them."""
    async with db.acquire_read() as conn:
        rows = await conn.fetch(q.ROLLUP_COMPLETED.text, *q.ROLLUP_COMPLETED.args(span=span, scope=scope))
    return {r["queue"]: r["completed"] for r in rows}
