"""What the metrics (app/telemetry/metrics.py, app/service/upkeep.py) and the readiness check
(app/service/health.py) read: per-queue gauges, flow control's held-back jobs, lock waits, what holds back
vacuum, the jobs table's health, and the schema's revision.
"""

from __future__ import annotations

from app.db.sql.fragments import _used
from app.db.sql.query import Query

# The metrics' gauges per queue (app/telemetry/metrics.py), read every few seconds by each replica: like
# QUEUE_STATS without `completed`, so it reads only the waiting, running and dead jobs, through the partial
# indexes that hold just those (ix_jobs_claim, ix_jobs_lease_expiry, ix_jobs_dead), however many finished rows
# the table keeps. `lag_seconds` is the age of the oldest ready job, measured from its run_at.
QUEUE_GAUGES = Query.define(
    "queue_gauges",
    """
    WITH active AS (
        SELECT queue, status, run_at FROM jobq.jobs WHERE status = 'pending'
        UNION ALL
        SELECT queue, status, run_at FROM jobq.jobs WHERE status = 'running'
        UNION ALL
        SELECT queue, status, run_at FROM jobq.jobs WHERE status = 'dead'
        UNION ALL
        SELECT queue, status, run_at FROM jobq.jobs WHERE status = 'waiting'
    ), s AS (
        SELECT queue,
               count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
               count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'dead') AS dead,
               count(*) FILTER (WHERE status = 'waiting') AS waiting,
               min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest_ready
        FROM active
        GROUP BY queue
    )
    SELECT q.name AS queue, q.paused,
           coalesce(s.pending, 0) AS pending, coalesce(s.scheduled, 0) AS scheduled,
           coalesce(s.running, 0) AS running, coalesce(s.dead, 0) AS dead,
           coalesce(s.waiting, 0) AS waiting,
           coalesce(extract(epoch FROM now() - s.oldest_ready), 0)::float8 AS lag_seconds,
           q.flow, q.key_concurrency, q.fair, q.rate_limit, q.rate_period, q.key_rate_limit, q.key_rate_period
    FROM jobq.queues q LEFT JOIN s ON s.queue = q.name
    ORDER BY q.name
    """,
)


# Flow control's gauges (app/telemetry/metrics.py), per queue under flow control: ready jobs held back by each
# kind of limit, counted up to :cap per queue and limit (a backlog of millions is not worth counting exactly
# every few seconds): jobs of keys at their concurrency, jobs of keys whose rate window is full, and every
# ready job while the queue's own window is full. A key at two limits counts under both.
def _held(keys: str) -> str:
    return f"""(SELECT count(*) FROM (
                 SELECT FROM {keys} h, LATERAL (
                     SELECT FROM jobq.jobs j
                     WHERE j.queue = h.queue AND j.key = h.key AND j.status = 'pending' AND j.run_at <= now()
                     LIMIT :cap) ready
                 WHERE h.queue = fq.name LIMIT :cap) held)"""


FLOW_GAUGES = Query.define(
    "flow_gauges",
    f"""
    WITH fq AS (
        SELECT * FROM jobq.queues WHERE flow
    ), running AS (
        SELECT j.queue, j.key, count(*) AS n
        FROM jobq.jobs j JOIN fq ON fq.name = j.queue
        WHERE j.status = 'running' AND j.key IS NOT NULL
        GROUP BY j.queue, j.key
    ), at_concurrency AS (
        SELECT r.queue, r.key FROM running r
        JOIN fq ON fq.name = r.queue
        LEFT JOIN jobq.keys o ON o.queue = r.queue AND o.key = r.key
        WHERE r.n >= coalesce(o.concurrency, fq.key_concurrency)
    ), at_rate AS (
        SELECT o.queue, o.key FROM jobq.keys o JOIN fq ON fq.name = o.queue
        WHERE coalesce(o.rate_limit, fq.key_rate_limit)
              <= {_used("o.rate_times", "o.rate_counts", "coalesce(o.rate_period, fq.key_rate_period)")}
    )
    SELECT fq.name AS queue, {_held("at_concurrency")} AS concurrency, {_held("at_rate")} AS key_rate,
           CASE WHEN fq.rate_limit <= {_used("fq.rate_times", "fq.rate_counts", "fq.rate_period")} THEN (
               SELECT count(*) FROM (
                   SELECT FROM jobq.jobs j
                   WHERE j.queue = fq.name AND j.status = 'pending' AND j.run_at <= now() LIMIT :cap) ready
           ) ELSE 0 END AS rate
    FROM fq
    ORDER BY fq.name
    """,
)

# Sessions in this database waiting for a heavyweight lock, and how long the oldest such statement has
# run: the sign of something holding locks the claim, an ack or lease expiry need. (A role that is neither
# superuser nor in pg_read_all_stats sees wait events of its own sessions only, which are jobq's.)
LOCK_WAITS = Query.define(
    "lock_waits",
    """
    SELECT count(*) AS waiting,
           coalesce(extract(epoch FROM max(clock_timestamp() - query_start)), 0)::float8 AS longest_seconds
    FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock'
    """,
)


# What holds back vacuum of jobq's tables (the xmin horizon of this database): per kind of holder, the
# oldest one, by the age of its xmin in transactions. A session's snapshot or transaction (this
# database's sessions, and walsenders, whose xmin is a standby's hot_standby_feedback), a replication
# slot's xmin, a prepared transaction. Autovacuum and plain VACUUM hold nothing back (PostgreSQL leaves
# vacuums out of the horizon), so they are not named. `seconds`: how long the transaction has been open
# (a replication slot and a walsender have no such time).
VACUUM_HORIZON = Query.define(
    "vacuum_horizon",
    r"""
    WITH horizon AS (
        SELECT 'session' AS holder, pid, application_name AS name, state,
               CASE WHEN backend_type <> 'walsender'
                    THEN extract(epoch FROM clock_timestamp() - xact_start)::float8 END AS seconds,
               greatest(age(backend_xmin), age(backend_xid))::bigint AS xid_age, left(query, 200) AS query
        FROM pg_stat_activity
        WHERE (datname = current_database() OR backend_type = 'walsender') AND pid <> pg_backend_pid()
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
          AND backend_type <> 'autovacuum worker' AND query !~* '^\s*vacuum\s*(\(|$|\s)(?!.*\mfull\M)'
        UNION ALL
        SELECT 'replication_slot', active_pid, slot_name::text,
               CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL, age(xmin)::bigint, NULL
        FROM pg_replication_slots
        WHERE xmin IS NOT NULL AND (database IS NULL OR database = current_database())
        UNION ALL
        SELECT 'prepared_transaction', NULL, gid, 'prepared',
               extract(epoch FROM clock_timestamp() - prepared)::float8, age(transaction)::bigint, NULL
        FROM pg_prepared_xacts
        WHERE database = current_database()
    )
    SELECT DISTINCT ON (holder) * FROM horizon ORDER BY holder, xid_age DESC, seconds DESC NULLS LAST
    """,
)

# The jobs table's health: live and dead tuples (the statistics collector's estimates), its size and its
# claim index's, in bytes, and seconds since it was last vacuumed (NULL: never since statistics reset).
TABLE_HEALTH = Query.define(
    "table_health",
    """
    SELECT n_live_tup AS live_tuples, n_dead_tup AS dead_tuples, pg_relation_size(relid) AS bytes,
           pg_relation_size('jobq.ix_jobs_claim'::regclass) AS claim_index_bytes,
           extract(epoch FROM clock_timestamp() - greatest(last_vacuum, last_autovacuum))::float8
               AS since_vacuum_seconds
    FROM pg_stat_user_tables
    WHERE relid = 'jobq.jobs'::regclass
    """,
)

# Readiness: the schema's migration revision, and the compatibility floor the migration recorded with
# it (a comment, so that a build that does not know a newer revision can still read it; app/db/migrations.py).
SCHEMA_REVISION = Query.define(
    "schema_revision",
    """
    SELECT (SELECT version_num FROM jobq.alembic_version) AS revision,
           obj_description('jobq.alembic_version'::regclass, 'pg_class') AS floor
    """,
)
