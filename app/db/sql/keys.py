"""Flow control's keys: a key's view (its overrides and its jobs waiting and running), its overrides
set and cleared, and keys rows left with nothing to keep pruned (app/service/flow.py).
"""

from __future__ import annotations

from app.db.sql.query import Query


# A rate as the API shows it, {limit, period}, or NULL.
def _rate_json(limit: str, period: str) -> str:
    return f"CASE WHEN {limit} IS NOT NULL THEN json_build_object('limit', {limit}, 'period', {period}) END"


# A key as the API shows it: its overrides (NULL: the queue's setting) and its jobs waiting and running.
KEY = f"""
    k.queue, k.key, o.concurrency,
    {_rate_json("o.rate_limit", "o.rate_period")} AS rate,
    (SELECT count(*) FROM jobq.jobs j WHERE j.queue = k.queue AND j.key = k.key AND j.status = 'pending')
        AS pending,
    (SELECT count(*) FROM jobq.jobs j WHERE j.queue = k.queue AND j.key = k.key AND j.status = 'running')
        AS running
"""
GET_KEY = Query.define(
    "get_key",
    f"""
    SELECT {KEY}
    FROM (SELECT :queue::text AS queue, :key::text AS key) k
    LEFT JOIN jobq.keys o ON o.queue = k.queue AND o.key = k.key
    """,
)
PUT_KEY = Query.define(
    "put_key",
    """
    INSERT INTO jobq.keys AS o (queue, key, concurrency, rate_limit, rate_period)
    VALUES (:queue, :key, :concurrency, :rate_limit, :rate_period)
    ON CONFLICT (queue, key) DO UPDATE SET
        concurrency = excluded.concurrency, rate_limit = excluded.rate_limit,
        rate_period = excluded.rate_period, updated_at = now()
    """,
)
# Overrides gone; a row still keeping a rate window stays until the window has passed (PRUNE_KEYS).
DELETE_KEY = Query.define(
    "delete_key",
    """
    WITH cleared AS (
        UPDATE jobq.keys SET concurrency = NULL, rate_limit = NULL, rate_period = NULL, updated_at = now()
        WHERE queue = :queue AND key = :key AND (concurrency IS NOT NULL OR rate_limit IS NOT NULL)
        RETURNING key
    )
    SELECT count(*) AS deleted FROM cleared
    """,
)
# The queue's keys with the most jobs waiting (then running), and keys with overrides, at most :limit.
LIST_KEYS = Query.define(
    "list_keys",
    f"""
    WITH counted AS (
        SELECT key, count(*) FILTER (WHERE status = 'pending') AS pending,
               count(*) FILTER (WHERE status = 'running') AS running
        FROM jobq.jobs
        WHERE queue = :queue AND key IS NOT NULL AND status IN ('pending', 'running')
        GROUP BY key
    ), listed AS (
        SELECT coalesce(c.key, o.key) AS key, coalesce(c.pending, 0) AS pending,
               coalesce(c.running, 0) AS running, o.concurrency, o.rate_limit, o.rate_period
        FROM counted c
        FULL JOIN (SELECT * FROM jobq.keys
                   WHERE queue = :queue AND (concurrency IS NOT NULL OR rate_limit IS NOT NULL)) o
             ON o.key = c.key
    )
    SELECT :queue::text AS queue, key, concurrency,
           {_rate_json("rate_limit", "rate_period")} AS rate, pending, running
    FROM listed
    ORDER BY pending DESC, running DESC, key
    LIMIT :limit
    """,
)
# Keys rows with no override whose rate window has passed: nothing left to keep (maintenance).
PRUNE_KEYS = Query.define(
    "prune_keys",
    """
    DELETE FROM jobq.keys o
    WHERE concurrency IS NULL AND rate_limit IS NULL
      AND (rate_times IS NULL OR rate_times[cardinality(rate_times)] < now() - interval '1 day')
    """,
)
