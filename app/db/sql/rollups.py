"""Rollups (app/service/rollups.py): per queue and minute, jobs enqueued, completed, failed and dead,
and the lag; written by every replica, read by the queues page and its charts.
"""

from __future__ import annotations

from app.db.sql.fragments import _in_scope
from app.db.sql.query import Query

# Rollups (app/service/rollups.py): one replica's counts since its last write, added to the current minute
# of each queue; the lag is the longest any replica saw in the minute.
ROLL_UP = Query.define(
    "roll_up",
    """
    INSERT INTO jobq.rollups AS r (queue, minute, enqueued, completed, failed, dead, lag)
    SELECT queue, date_trunc('minute', now()), enqueued, completed, failed, dead, lag
    FROM unnest(:queues::text[], :enqueued::bigint[], :completed::bigint[], :failed::bigint[],
                :dead::bigint[], :lags::float8[]) AS t(queue, enqueued, completed, failed, dead, lag)
    ON CONFLICT (queue, minute) DO UPDATE
    SET enqueued = r.enqueued + excluded.enqueued, completed = r.completed + excluded.completed,
        failed = r.failed + excluded.failed, dead = r.dead + excluded.dead,
        lag = greatest(r.lag, excluded.lag)
    """,
)

FORGET_ROLLUPS = Query.define(
    "forget_rollups",
    "DELETE FROM jobq.rollups WHERE minute < now() - make_interval(secs => :kept)",
)

# Each queue's jobs completed in the last :span seconds, from the rollups (the queues page).
ROLLUP_COMPLETED = Query.define(
    "rollup_completed",
    f"""
    SELECT queue, sum(completed)::bigint AS completed FROM jobq.rollups
    WHERE minute >= now() - make_interval(secs => :span) AND {_in_scope("queue")}
    GROUP BY queue
    """,
)

# A queue's rollups over the last :span seconds, in steps of :step seconds counted from :origin (a row
# per step with any).
ROLLUP_SERIES = Query.define(
    "rollup_series",
    """
    SELECT date_bin(make_interval(secs => :step), minute, :origin::timestamptz) AS at,
           sum(enqueued)::bigint AS enqueued, sum(completed)::bigint AS completed,
           sum(failed)::bigint AS failed, sum(dead)::bigint AS dead, max(lag) AS lag
    FROM jobq.rollups
    WHERE queue = :queue AND minute >= now() - make_interval(secs => :span)
    GROUP BY 1 ORDER BY 1
    """,
)
