"""jobq.lease_flow_front(): the claim from the front of a queue under key concurrency alone
(app/service/flow.py), its two statements in one function, so that a claim is one round trip instead of four

The claim locks the front's jobs and their keys in one statement (FRONT) and leases, in a second whose
snapshot begins once the locks are held, those within their key's room (LEASE); see app/db/sql/claim.py,
"flow control", for why two statements. Sent one by one in a transaction, with its BEGIN and COMMIT, that
is four round trips, where the plain LEASE is one: in a drain of 100,000 keyed jobs (lease 100 +
/ack/batch, 4 workers, 1,000 keys, key_concurrency 2) the service spent 1.83 s of CPU against 1.54 as
one call, and drained at 24,662 jobs/s against 27,100. Each statement of a volatile PL/pgSQL function
(the default) takes a snapshot of its own under READ COMMITTED, so the second still sees every claim that
committed before the first's locks were held.

FRONT and LEASE are the statements as the function runs them, with named parameters (:queue), which it
takes as p_queue and so on; tests read them from here to check their plans. The function runs under
the claims' plan settings (FLOW_PLANS in app/service/flow.py), as its own SET clauses.

Expand only: a new function. Code of revision 0014 runs on this schema unchanged: it never calls it.

Revision ID: 0021
Revises: 0020
Create Date: 2027-04-09
"""

import re

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0020's floor).
compatible_from = "0014"

SCHEMA = "jobq"

# The first :lookahead ready jobs in lease order, each locked (SKIP LOCKED: two claims at once take
# consecutive stretches of the front), and the advisory lock of each of their keys, tried once per key
# (`locked` false: another claim holds it; NULL for a job without a key), the same lock as the walk's
# (app/db/sql/claim.py, _KEY_LOCK). Each job is given its key's answer by a window over the jobs, not by a
# join of jobs to keys: planned once for any claim, on estimates of one row, such a join was a nested loop,
# quadratic in the claim (5.4 of a claim's 5.8 ms for 216 jobs, in a drain).
FRONT = """
    WITH front AS (
        SELECT id, key, row_number() OVER (ORDER BY priority, run_at, id) AS ord FROM (
            SELECT id, key, priority, run_at FROM jobq.jobs
            WHERE queue = :queue AND status = 'pending' AND run_at <= now()
              AND EXISTS (SELECT FROM jobq.queues WHERE name = :queue AND NOT paused AND flow)
            ORDER BY priority, run_at, id
            LIMIT :lookahead
            FOR UPDATE SKIP LOCKED
        ) f
    ), tried AS (
        SELECT id, key, ord,
               CASE WHEN first THEN pg_try_advisory_xact_lock(hashtextextended(key, hashtext(:queue))) END
               AS got
        FROM (SELECT id, key, ord, key IS NOT NULL AND row_number() OVER (PARTITION BY key ORDER BY ord) = 1
                     AS first
              FROM front OFFSET 0) f
    )
    SELECT id, key, ord, bool_or(got) OVER (PARTITION BY key) AS locked FROM tried ORDER BY ord
"""

# Of the jobs FRONT locked whose keys it holds (:ids and their :keys, in lease order), lease those within
# their key's room, in lease order, one per slot, as LEASE leases them (app/db/sql/claim.py). A key whose jobs
# run in order (concurrency 1) gets a job only if it is the key's first (its retry when one waits, else its
# first ready job by lease order, whatever the locks): a first job another statement held back is not
# overtaken. Nothing is leased when the queue has become fair or rated since (the caller claims it the
# other way), nor of a key with a rate of its own.
# - `keyed`: at each key's first job, once per key, its room (its concurrency, an override's or the
#   queue's, less its running jobs) and, for a key in order, its first job; `spread` gives them to the
#   key's other jobs by a window, not by a join of jobs to keys (see FRONT).
LEASE = """
    WITH q AS (
        SELECT max_attempts, visibility_timeout, key_concurrency FROM jobq.queues
        WHERE name = :queue AND NOT paused AND flow AND NOT fair AND rate_limit IS NULL
          AND key_rate_limit IS NULL
    ), front AS (
        SELECT id, key, ord, row_number() OVER (PARTITION BY key ORDER BY ord) AS n
        FROM unnest(:ids::bigint[], :keys::text[]) WITH ORDINALITY AS u(id, key, ord)
    ), keyed AS (
        SELECT f.id, f.key, f.ord, k.concurrency, k.rated,
               CASE WHEN f.n = 1 THEN coalesce(
                   k.concurrency - (SELECT count(*) FROM jobq.jobs h
                                    WHERE h.queue = :queue AND h.key = f.key AND h.status = 'running'),
                   cardinality(:worker_ids::text[])) END AS room,
               CASE WHEN f.n = 1 AND k.concurrency = 1 THEN coalesce(
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = :queue AND h.key = f.key AND h.status = 'pending' AND h.attempts > 0
                    ORDER BY priority, run_at, id LIMIT 1),
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = :queue AND h.key = f.key AND h.status = 'pending' AND h.run_at <= now()
                    ORDER BY priority, run_at, id LIMIT 1)) END AS first
        FROM front f CROSS JOIN q
        LEFT JOIN LATERAL (
            SELECT coalesce(o.concurrency, q.key_concurrency) AS concurrency,
                   o.rate_limit IS NOT NULL AS rated
            FROM (SELECT) one LEFT JOIN jobq.keys o ON o.queue = :queue AND o.key = f.key
        ) k ON f.key IS NOT NULL
    ), spread AS (
        SELECT id, key, ord, concurrency, rated,
               max(room) OVER per_key AS room, max(first) OVER per_key AS first
        FROM keyed WINDOW per_key AS (PARTITION BY key)
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY ord) AS slot FROM (
            SELECT id, key, ord, room, row_number() OVER (PARTITION BY key ORDER BY ord) AS n
            FROM spread
            WHERE key IS NULL OR (NOT rated AND (concurrency IS DISTINCT FROM 1 OR first = id))
        ) c
        WHERE key IS NULL OR n <= room
        ORDER BY ord
        LIMIT cardinality(:worker_ids::text[])
    )
    UPDATE jobq.jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(
            secs => coalesce((:visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
        worker_id = (:worker_ids::text[])[ready.slot], updated_at = now()
    FROM ready, q
    WHERE j.id = ready.id AND j.status = 'pending'
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
              coalesce(j.max_attempts, q.max_attempts, 5) AS max_attempts, j.run_at, j.created_at,
              j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate, ready.slot
"""

# The leased jobs (as LEASE returns them, with each one's slot), and on every row, or on one row with the
# job's columns NULL when nothing was leased: `looked`, how many jobs FRONT locked, and `passed`, how
# many of those it passed over because another claim held their key.
COLUMNS = """
    id bigint, queue text, kind text, key text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, run_at timestamptz, created_at timestamptz, last_error text, lease_token uuid,
    lease_expires_at timestamptz, traceparent text, tracestate text, slot bigint, looked integer,
    passed integer
"""

FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.lease_flow_front(
    p_queue text, p_lookahead integer, p_visibility_timeouts double precision[], p_worker_ids text[]
) RETURNS TABLE ({columns})
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    p_ids bigint[];
    p_keys text[];
    n_looked integer;
    n_passed integer;
BEGIN
    SELECT coalesce(array_agg(f.id ORDER BY f.ord) FILTER (WHERE f.locked IS NOT FALSE), '{{}}'),
           coalesce(array_agg(f.key ORDER BY f.ord) FILTER (WHERE f.locked IS NOT FALSE), '{{}}'),
           count(*), count(*) FILTER (WHERE f.locked IS FALSE)
    INTO p_ids, p_keys, n_looked, n_passed
    FROM ({front}) f;
    RETURN QUERY WITH leased AS ({lease}) SELECT leased.*, n_looked, n_passed FROM leased;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::integer,
            NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::uuid,
            NULL::timestamptz, NULL::text, NULL::text, NULL::bigint, n_looked, n_passed;
    END IF;
END
$fn$
"""

SIGNATURE = f"{SCHEMA}.lease_flow_front(text, integer, double precision[], text[])"


def _in_function(statement: str) -> str:
    """`statement` with its named parameters as the function's (:queue -> p_queue)."""
    return re.sub(r"(?<!:):(\w+)", r"p_\1", statement)


def upgrade() -> None:
    op.execute(
        FUNCTION.format(schema=SCHEMA, columns=COLUMNS, front=_in_function(FRONT), lease=_in_function(LEASE))
    )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
