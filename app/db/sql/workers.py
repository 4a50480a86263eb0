"""Workers seen (app/service/workers_seen.py): who leased from which queue and when, kept a while for
the workers page, beside the running jobs each holds now.
"""

from __future__ import annotations

from app.db.sql.fragments import _in_scope
from app.db.sql.query import Query

# Workers seen (app/service/workers_seen.py): what one replica saw since its last write, one row per (worker,
# queue), added to what is kept; the later of two sightings wins, leases add up.
SEE_WORKERS = Query.define(
    "see_workers",
    """
    INSERT INTO jobq.workers AS w (worker_id, queue, last_seen, leased)
    SELECT * FROM unnest(:worker_ids::text[], :queues::text[], :last_seen::timestamptz[], :leased::bigint[])
    ON CONFLICT (worker_id, queue) DO UPDATE
    SET last_seen = greatest(w.last_seen, excluded.last_seen), leased = w.leased + excluded.leased
    """,
)

# Workers not seen for :kept seconds are forgotten (a handful of rows per worker: no batching needed).
FORGET_WORKERS = Query.define(
    "forget_workers",
    "DELETE FROM jobq.workers WHERE last_seen < now() - make_interval(secs => :kept) RETURNING worker_id",
)

# The workers page: each worker seen, or holding a running job, in the queues of :scope, with what it
# holds now (its running jobs, read through ix_jobs_lease_expiry: only running jobs are in it).
LIST_WORKERS = Query.define(
    "list_workers",
    f"""
    WITH seen AS (
        SELECT worker_id, array_agg(queue ORDER BY queue) AS queues, max(last_seen) AS last_seen,
               sum(leased)::bigint AS leased
        FROM jobq.workers WHERE {_in_scope("queue")}
        GROUP BY worker_id
    ), held AS (
        SELECT worker_id, count(*) AS held, min(lease_expires_at) AS next_deadline,
               array_agg(DISTINCT queue) AS queues
        FROM jobq.jobs
        WHERE status = 'running' AND lease_expires_at IS NOT NULL AND worker_id IS NOT NULL
          AND {_in_scope("queue")}
        GROUP BY worker_id
    )
    SELECT worker_id, coalesce(s.queues, h.queues) AS queues, s.last_seen, coalesce(s.leased, 0) AS leased,
           coalesce(h.held, 0) AS held, h.next_deadline
    FROM seen s FULL JOIN held h USING (worker_id)
    ORDER BY s.last_seen DESC NULLS LAST, worker_id
    LIMIT :limit
    """,
)
