"""Queues: their settings (flow control's included), pausing, the per-queue counts of GET /queues, and
SQS's PurgeQueue and DeleteQueue, which take a queue's jobs with them.
"""

from __future__ import annotations

from app.core.limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION,
    DEFAULT_VISIBILITY_TIMEOUT,
)
from app.db.sql.fragments import CHANNEL, NOTIFIED, QUEUE_LOCK_CLASS, _in_scope, _notify, _notify_done
from app.db.sql.query import Query

# SQS PurgeQueue: every message of the queue, visible or in flight; dead ones stay (they are the queue's
# dead letters, which SQS would keep in another queue).
PURGE_QUEUE = Query.define(
    "purge_queue",
    f"""
    DELETE FROM jobq.jobs j WHERE queue = :queue AND status IN ('pending', 'running')
    RETURNING {_notify_done()}
    """,
)

# SQS DeleteQueue, first: the queue's lock, exclusively (QUEUE_LOCK_CLASS), in a statement of its own, in
# DELETE_QUEUE's transaction. It waits for every enqueue into the queue in flight, an application's open
# transaction that called jobq.enqueue() included; DELETE_QUEUE, which starts after, sees their jobs and
# deletes them too. An enqueue arriving meanwhile waits for the delete to commit, then creates the queue
# row again with its job. So no job outlives its queue row.
LOCK_QUEUE = Query.define(
    "lock_queue",
    f"SELECT pg_advisory_xact_lock({QUEUE_LOCK_CLASS}, hashtext(:queue))",
)

# SQS DeleteQueue: the queue and every job it holds, in any status (after LOCK_QUEUE).
DELETE_QUEUE = Query.define(
    "delete_queue",
    """
    WITH gone AS (DELETE FROM jobq.jobs WHERE queue = :queue),
         finished AS (DELETE FROM jobq.jobs_history WHERE queue = :queue)
    DELETE FROM jobq.queues WHERE name = :queue RETURNING name
    """,
)

# Per-queue counts. `pending` is ready now; `scheduled` waits for a future run_at (both are state pending);
# `waiting` waits for its parents.
# The oldest ready job's age is the lag behind run_at, the first sign of workers falling behind.
QUEUE_STATS = Query.define(
    "queue_stats",
    f"""
    SELECT q.name AS queue,
           coalesce(s.pending, 0) AS pending, coalesce(s.scheduled, 0) AS scheduled,
           coalesce(s.running, 0) AS running, coalesce(s.dead, 0) AS dead,
           coalesce(s.completed, 0) AS completed, coalesce(s.waiting, 0) AS waiting,
           coalesce(extract(epoch FROM now() - s.oldest_ready), 0)::float8 AS oldest_pending_age_seconds,
           q.paused,
           q.visibility_timeout, q.max_attempts, q.backoff_base, q.backoff_cap, q.retention,
           q.key_concurrency, q.fair, q.rate_limit, q.rate_period, q.key_rate_limit, q.key_rate_period,
           q.push
    FROM jobq.queues q
    LEFT JOIN (
        SELECT queue,
               count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
               count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'dead') AS dead,
               count(*) FILTER (WHERE status = 'completed') AS completed,
               count(*) FILTER (WHERE status = 'waiting') AS waiting,
               min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest_ready
        FROM jobq.all_jobs
        WHERE status <> 'cancelled' AND (:queue::text IS NULL OR queue = :queue::text)
          AND {_in_scope("queue")}
        GROUP BY queue
    ) s ON s.queue = q.name
    WHERE (:queue::text IS NULL OR q.name = :queue::text) AND {_in_scope("q.name")}
    ORDER BY q.name
    """,
)

# A queue's cancelled jobs not yet pruned, for its dashboard page (QUEUE_STATS, and so GET /queues, counts
# none). Cancelled jobs are in jobq.jobs_history alone; its key starts with the queue.
QUEUE_CANCELLED = Query.define(
    "queue_cancelled",
    "SELECT count(*) FROM jobq.jobs_history WHERE queue = :queue AND status = 'cancelled'",
)


# Create a queue or change its settings; a NULL argument keeps the current value (or the default).
# Flow-control settings come as :flow, a JSON object holding only those to change (a null clears one):
# {"key_concurrency": 2, "fair": true, "rate": {"limit": 100, "period": 60}, "key_rate": null}. The
# queue's row stays locked to the end of the transaction, which then runs SET_FLOW.
def _flow_setting(name: str, value: str, current: str) -> str:
    return f"CASE WHEN :flow::jsonb ? '{name}' THEN {value} ELSE {current} END"


CONFIGURE_QUEUE = Query.define(
    "configure_queue",
    f"""
    INSERT INTO jobq.queues AS q
        (name, visibility_timeout, max_attempts, backoff_base, backoff_cap, retention)
    VALUES (:queue, coalesce(:visibility_timeout::float8, {DEFAULT_VISIBILITY_TIMEOUT}),
            coalesce(:max_attempts::int, {DEFAULT_MAX_ATTEMPTS}),
            coalesce(:backoff_base::float8, {DEFAULT_BACKOFF_BASE}),
            coalesce(:backoff_cap::float8, {DEFAULT_BACKOFF_CAP}),
            coalesce(:retention::float8, {DEFAULT_RETENTION}))
    ON CONFLICT (name) DO UPDATE SET
        visibility_timeout = coalesce(:visibility_timeout::float8, q.visibility_timeout),
        max_attempts = coalesce(:max_attempts::int, q.max_attempts),
        backoff_base = coalesce(:backoff_base::float8, q.backoff_base),
        backoff_cap = coalesce(:backoff_cap::float8, q.backoff_cap),
        retention = coalesce(:retention::float8, q.retention),
        updated_at = now()
    RETURNING name
    """,
)
_FLOW_COLUMNS = {
    "key_concurrency": ("key_concurrency", "(:flow::jsonb->>'key_concurrency')::int"),
    "fair": ("fair", "coalesce((:flow::jsonb->>'fair')::boolean, false)"),
    "rate_limit": ("rate", "(:flow::jsonb->'rate'->>'limit')::int"),
    "rate_period": ("rate", "(:flow::jsonb->'rate'->>'period')::float8"),
    "key_rate_limit": ("key_rate", "(:flow::jsonb->'key_rate'->>'limit')::int"),
    "key_rate_period": ("key_rate", "(:flow::jsonb->'key_rate'->>'period')::float8"),
}
CONFIGURE_FLOW = Query.define(
    "configure_flow",
    f"""
    UPDATE jobq.queues SET
        {", ".join(f"{col} = {_flow_setting(*setting, col)}" for col, setting in _FLOW_COLUMNS.items())}
    WHERE name = :queue
    """,
)

# After a change of a queue's flow-control settings or of a key's overrides, in the same transaction (the
# queue's row locked by its first statement, so that this one, which starts later, sees every change
# committed before): whether the queue is now under flow control, and a notification that makes every
# replica read it again (app/service/flow.py) and wakes the queue's long-polls to look again.
SET_FLOW = Query.define(
    "set_flow",
    f"""
    WITH changed AS (
        UPDATE jobq.queues q
        SET flow = key_concurrency IS NOT NULL OR fair OR rate_limit IS NOT NULL
                   OR key_rate_limit IS NOT NULL
                   OR EXISTS (SELECT FROM jobq.keys k
                              WHERE k.queue = q.name
                                AND (k.concurrency IS NOT NULL OR k.rate_limit IS NOT NULL)),
            updated_at = now()
        WHERE name = :queue
        RETURNING name, flow
    )
    SELECT flow, pg_notify('{CHANNEL}', json_build_object(
               'queue', name, 'n', {2**31 - 1}, 'run_at', extract(epoch FROM now()), 'settings', true)::text)
    FROM changed
    """,
)

# Whether a queue has a row: a filter naming a queue that has none is answered 404, not an empty list.
QUEUE_EXISTS = Query.define("queue_exists", "SELECT EXISTS (SELECT FROM jobq.queues WHERE name = :queue)")

# A queue's flow-control settings, as the lease reads them (NULL: the queue does not exist).
QUEUE_FLOW = Query.define(
    "queue_flow",
    """
    SELECT flow, key_concurrency, fair,
           rate_limit IS NOT NULL OR key_rate_limit IS NOT NULL
           OR EXISTS (SELECT FROM jobq.keys k WHERE k.queue = q.name AND k.rate_limit IS NOT NULL) AS rated
    FROM jobq.queues q WHERE name = :queue
    """,
)

# The queue's row, created if need be, locked for the rest of the transaction (a key's overrides change
# under it, then SET_FLOW).
LOCK_QUEUE_ROW = Query.define(
    "lock_queue_row",
    """
    INSERT INTO jobq.queues AS q (name) VALUES (:queue)
    ON CONFLICT (name) DO UPDATE SET updated_at = now()
    """,
)

# Pause or resume a queue (creating it if need be, so a queue can be paused before its first job).
# Resuming wakes the queue's waiters: its ready jobs (counted up to 1000) are leasable again.
SET_PAUSED = Query.define(
    "set_paused",
    f"""
    WITH changed AS (
        INSERT INTO jobq.queues AS q (name, paused) VALUES (:queue, :paused)
        ON CONFLICT (name) DO UPDATE SET paused = :paused, updated_at = now()
        RETURNING name, paused
    ), ready AS (
        SELECT changed.name AS queue, j.run_at
        FROM changed, LATERAL (
            SELECT run_at FROM jobq.jobs
            WHERE jobs.queue = changed.name AND status = 'pending' AND run_at <= now() LIMIT 1000
        ) j
        WHERE NOT changed.paused
    ), {_notify("ready")}
    SELECT count(*) FROM changed WHERE {NOTIFIED}
    """,
)
