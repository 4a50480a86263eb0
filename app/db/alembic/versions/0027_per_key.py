"""Several jobs of an in-order key in one lease: jobq.lease_flow_front() takes `p_per_key` (default 1)

Under key_concurrency 1, a lease that asks for it (`per_key`, app/service/leasing.py; SQS's FIFO receives)
takes a key's first ready job and up to p_per_key - 1 of those right after it, in order, when nothing of
the key is running; the key stays held until all of them have ended, as it is by one. Of a key's jobs
that have begun, the first enqueued holds it (a retry's run_at is its retry's, not its place). The
function gains a parameter with a default, so its signature changes: the old one is dropped and the new
one made in one transaction, and a caller of revision 0014 or later (four arguments) gets the default.

Revision ID: 0027
Revises: 0026
Create Date: 2027-08-03
"""

from alembic import op

from app.db.migrations import revision_module

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (a parameter added with a default: 0026's floor).
compatible_from = "0014"

OLD_SIGNATURE = "jobq.lease_flow_front(text, integer, double precision[], text[])"
NEW_SIGNATURE = "jobq.lease_flow_front(text, integer, double precision[], text[], integer)"

# As app/db/functions.sql has it at this revision.
LEASE_FLOW_FRONT = r"""
CREATE OR REPLACE FUNCTION jobq.lease_flow_front(
    p_queue text, p_lookahead integer, p_visibility_timeouts double precision[], p_worker_ids text[],
    p_per_key integer DEFAULT 1
) RETURNS TABLE (
    id bigint, queue text, kind text, key text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, run_at timestamptz, created_at timestamptz, last_error text, lease_token uuid,
    lease_expires_at timestamptz, traceparent text, tracestate text, depends_on bigint[], journal jsonb[],
    slot bigint, looked integer, passed integer
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    p_ids bigint[];
    p_keys text[];
    n_looked integer;
    n_passed integer;
BEGIN
    SELECT coalesce(array_agg(f.id ORDER BY f.ord) FILTER (WHERE f.locked IS NOT FALSE), '{}'),
           coalesce(array_agg(f.key ORDER BY f.ord) FILTER (WHERE f.locked IS NOT FALSE), '{}'),
           count(*), count(*) FILTER (WHERE f.locked IS FALSE)
    INTO p_ids, p_keys, n_looked, n_passed
    FROM (
    WITH front AS (
        SELECT id, key, row_number() OVER (ORDER BY priority, run_at, id) AS ord FROM (
            SELECT id, key, priority, run_at FROM jobq.jobs
            WHERE queue = p_queue AND status = 'pending' AND run_at <= now()
              AND EXISTS (SELECT FROM jobq.queues WHERE name = p_queue AND NOT paused AND flow)
            ORDER BY priority, run_at, id
            LIMIT p_lookahead
            FOR UPDATE SKIP LOCKED
        ) f
    ), tried AS (
        SELECT id, key, ord,
               CASE WHEN first THEN pg_try_advisory_xact_lock(hashtextextended(key, hashtext(p_queue))) END
               AS got
        FROM (SELECT id, key, ord, key IS NOT NULL AND row_number() OVER (PARTITION BY key ORDER BY ord) = 1
                     AS first
              FROM front OFFSET 0) f
    )
    SELECT id, key, ord, bool_or(got) OVER (PARTITION BY key) AS locked FROM tried ORDER BY ord
) f;
    RETURN QUERY WITH leased AS (
    WITH q AS (
        SELECT max_attempts, visibility_timeout, key_concurrency FROM jobq.queues
        WHERE name = p_queue AND NOT paused AND flow AND NOT fair AND rate_limit IS NULL
          AND key_rate_limit IS NULL
    ), front AS (
        SELECT id, key, ord, row_number() OVER (PARTITION BY key ORDER BY ord) AS n
        FROM unnest(p_ids::bigint[], p_keys::text[]) WITH ORDINALITY AS u(id, key, ord)
    ), keyed AS (
        SELECT f.id, f.key, f.ord, f.n, k.concurrency, k.rated,
               CASE WHEN f.n = 1 THEN coalesce(
                   k.concurrency - (SELECT count(*) FROM jobq.jobs h
                                    WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'running'),
                   cardinality(p_worker_ids::text[])) END AS room,
               CASE WHEN f.n = 1 AND k.concurrency = 1 THEN coalesce(
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = p_queue AND h.key = f.key
                      AND (h.status = 'pending' AND (h.attempts > 0 OR h.sleep_until IS NOT NULL)
                           OR h.status = 'waiting' AND h.wait_event IS NOT NULL)
                    ORDER BY priority, id LIMIT 1),
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'pending' AND h.run_at <= now()
                    ORDER BY priority, run_at, id LIMIT 1)) END AS first,
               CASE WHEN f.n = 1 AND k.concurrency = 1 AND p_per_key > 1 THEN ARRAY(
                   SELECT id FROM jobq.jobs h
                   WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'pending' AND h.run_at <= now()
                   ORDER BY priority, run_at, id LIMIT p_per_key) END AS run
        FROM front f CROSS JOIN q
        LEFT JOIN LATERAL (
            SELECT coalesce(o.concurrency, q.key_concurrency) AS concurrency,
                   o.rate_limit IS NOT NULL AS rated
            FROM (SELECT) one LEFT JOIN jobq.keys o ON o.queue = p_queue AND o.key = f.key
        ) k ON f.key IS NOT NULL
    ), spread AS (
        SELECT id, key, ord, n AS front_n, concurrency, rated,
               max(room) OVER per_key AS room, max(first) OVER per_key AS first, max(run) OVER per_key AS run
        FROM keyed WINDOW per_key AS (PARTITION BY key)
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY ord) AS slot FROM (
            SELECT id, key, ord, room, concurrency, row_number() OVER (PARTITION BY key ORDER BY ord) AS n
            FROM spread
            WHERE key IS NULL OR (NOT rated AND (concurrency IS DISTINCT FROM 1 OR first = id
                                                 OR (run[1] = first AND run[front_n] = id)))
        ) c
        WHERE key IS NULL OR n <= CASE WHEN concurrency = 1 AND room > 0 THEN p_per_key ELSE room END
        ORDER BY ord
        LIMIT cardinality(p_worker_ids::text[])
    )
    UPDATE jobq.jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(
            secs => coalesce((p_visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
        worker_id = (p_worker_ids::text[])[ready.slot], updated_at = now(), debounce_key = NULL
    FROM ready, q
    WHERE j.id = ready.id AND j.status = 'pending'
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
              coalesce(j.max_attempts, q.max_attempts, 5) AS max_attempts, j.run_at, j.created_at,
              j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate, j.depends_on,
              (SELECT ARRAY[r.steps, r.events] FROM jobq.job_journal r WHERE j.journaled AND r.job_id = j.id)
              AS journal, ready.slot
) SELECT leased.*, n_looked, n_passed FROM leased;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::integer,
            NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::uuid,
            NULL::timestamptz, NULL::text, NULL::text, NULL::bigint[], NULL::jsonb[], NULL::bigint, n_looked,
            n_passed;
    END IF;
END
$$;
"""


def upgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
    op.execute(LEASE_FLOW_FRONT)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
    op.execute(revision_module("0026").LEASE_FLOW_FRONT)
