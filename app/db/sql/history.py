"""Finished jobs (completed, cancelled) in jobq.jobs_history, kept for their queue's retention: moved
there when an older release left them in jobq.jobs, pruned when it ends, and the day partitions that
retention drops whole (app/service/history.py).
"""

from __future__ import annotations

from app.core.limits import DEFAULT_RETENTION
from app.db.sql.fragments import _MOVED
from app.db.sql.query import Query

# Finished jobs still in jobq.jobs (finished before jobs_history existed, or by a replica of an older
# release during a rolling upgrade) moved to jobs_history, kept until their completed_at plus their
# queue's retention; those past it already are only deleted. A bounded batch per statement, so no move
# holds many locks or a long transaction; the caller loops while batches come back full.
MOVE_FINISHED = Query.define(
    "move_finished",
    f"""
    WITH doomed AS (
        SELECT id FROM jobq.jobs
        WHERE status IN ('completed', 'cancelled')
        ORDER BY completed_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ), kept AS ({_MOVED}
    )
    DELETE FROM jobq.jobs j USING doomed WHERE j.id = doomed.id
    """,
)

# Retention in the default partition of jobs_history, which holds the finished jobs no day's partition
# took (app/service/history.py): the rows past their purge_after deleted, a bounded batch per statement.
PRUNE_HISTORY_DEFAULT = Query.define(
    "prune_history_default",
    """
    WITH doomed AS (
        SELECT id, purge_after FROM jobq.jobs_history_default
        WHERE purge_after <= now()
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobq.jobs_history_default h USING doomed
    WHERE h.id = doomed.id AND h.purge_after = doomed.purge_after
    """,
)

# The day partitions of jobs_history (named jobs_history_pYYYYMMDD, each holding the jobs whose
# purge_after falls on that day, UTC).
HISTORY_PARTITIONS = Query.define(
    "history_partitions",
    """
    SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'jobq.jobs_history'::regclass AND c.relname ~ '^jobs_history_p[0-9]{8}$'
    """,
)

# The days (UTC) whose partitions jobs_history needs now: for each retention in use (and the default,
# for queues still to come), the day a job finished now is purged, and the day after (made a day ahead,
# so a partition is there before its first job, whenever the next round runs). `today`: partitions of
# days before it hold only jobs past their purge_after, and go whole.
HISTORY_DAYS = Query.define(
    "history_days",
    f"""
    SELECT (now() AT TIME ZONE 'UTC')::date AS today,
           array_agg(DISTINCT (now() AT TIME ZONE 'UTC' + make_interval(secs => r, days => d))::date) AS days
    FROM (SELECT retention FROM jobq.queues UNION SELECT {DEFAULT_RETENTION}) t(r), generate_series(0, 1) d
    """,
)
