"""In-order keys held by jobs that sleep or wait: a job of a key under key_concurrency 1 that has begun holds
the key's place until it ends, also while it sleeps (a release with a delay), while it is parked on an event,
and once woken from either

Before, such a job held its key only while running or pending with attempts > 0: a release counts no
attempt, so a job released on its first attempt, asleep or parked, let the key's later jobs run before it
(found by the chaos checker, chaos/checker.py). A job woken from a wait now keeps `sleep_until` (when the
wait ended), which marks it as begun, as a sleep's end does.

- jobq.lease_flow_front(), jobq.await_event() and jobq.send_event(), as app/db/functions.sql has them;
- ix_jobs_key_held over the jobs that hold a key (sql.fragments.KEY_HOLDER), built CONCURRENTLY under
  another name, the old one dropped CONCURRENTLY and the new one renamed, as 0020 did.

Code of revision 0014 runs on this schema: its claims read the index with the narrower condition, which
the new one covers.

Revision ID: 0026
Revises: 0025
Create Date: 2027-07-20
"""

from alembic import op

from app.db.migrations import build_index, revision_module

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (functions replaced, an index widened: 0025's floor).
compatible_from = "0014"

SCHEMA = "jobq"
NAME = "ix_jobs_key_held"
HELD = (
    "WHERE key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND (attempts > 0 OR "
    "sleep_until IS NOT NULL)) OR (status = 'waiting' AND wait_event IS NOT NULL))"
)
OLD_HELD = "WHERE key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND attempts > 0))"

# As app/db/functions.sql has them at this revision.
LEASE_FLOW_FRONT = r"""
CREATE OR REPLACE FUNCTION jobq.lease_flow_front(
    p_queue text, p_lookahead integer, p_visibility_timeouts double precision[], p_worker_ids text[]
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
        SELECT f.id, f.key, f.ord, k.concurrency, k.rated,
               CASE WHEN f.n = 1 THEN coalesce(
                   k.concurrency - (SELECT count(*) FROM jobq.jobs h
                                    WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'running'),
                   cardinality(p_worker_ids::text[])) END AS room,
               CASE WHEN f.n = 1 AND k.concurrency = 1 THEN coalesce(
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = p_queue AND h.key = f.key
                      AND (h.status = 'pending' AND (h.attempts > 0 OR h.sleep_until IS NOT NULL)
                           OR h.status = 'waiting' AND h.wait_event IS NOT NULL)
                    ORDER BY priority, run_at, id LIMIT 1),
                   (SELECT id FROM jobq.jobs h
                    WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'pending' AND h.run_at <= now()
                    ORDER BY priority, run_at, id LIMIT 1)) END AS first
        FROM front f CROSS JOIN q
        LEFT JOIN LATERAL (
            SELECT coalesce(o.concurrency, q.key_concurrency) AS concurrency,
                   o.rate_limit IS NOT NULL AS rated
            FROM (SELECT) one LEFT JOIN jobq.keys o ON o.queue = p_queue AND o.key = f.key
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
AWAIT_EVENT = r"""
CREATE OR REPLACE FUNCTION jobq.await_event(
    p_id bigint, p_queue text, p_lease_token uuid, p_event text, p_timeout double precision
) RETURNS TABLE (id bigint, status text, run_at timestamptz, event_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_job jobq.jobs%ROWTYPE;
    v_event jobq.events%ROWTYPE;
BEGIN
    PERFORM pg_advisory_xact_lock(1785684581, hashtext(p_event));
    SELECT * INTO v_job FROM jobq.jobs j
    WHERE j.id = p_id AND j.queue = p_queue AND j.lease_token = p_lease_token AND j.status = 'running'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_event FROM jobq.events e
    WHERE e.name = p_event AND e.at >= v_job.created_at
      AND (e.scope IS NULL OR v_job.queue LIKE ANY (e.scope))
      AND NOT EXISTS (
          SELECT FROM jobq.job_journal r
          WHERE r.job_id = p_id AND r.events @> jsonb_build_array(jsonb_build_object('id', e.id)))
    ORDER BY e.id LIMIT 1;
    IF FOUND THEN
        INSERT INTO jobq.job_journal AS r (job_id, events)
        VALUES (p_id, jsonb_build_array(jsonb_build_object(
            'id', v_event.id, 'name', v_event.name, 'payload', v_event.payload, 'at', v_event.at)))
        ON CONFLICT (job_id) DO UPDATE SET events = coalesce(r.events, '[]') || excluded.events;
        RETURN QUERY UPDATE jobq.jobs j
        SET status = 'pending', attempts = j.attempts - 1, lease_token = NULL, lease_expires_at = NULL,
            worker_id = NULL, updated_at = now(), run_at = now(), sleep_until = now(), wait_event = NULL,
            journaled = true
        WHERE j.id = p_id
        RETURNING j.id, j.status, j.run_at, v_event.id;
        PERFORM pg_notify('jobq', json_build_object(
            'queue', p_queue, 'n', 1, 'run_at', extract(epoch FROM now()))::text);
    ELSE
        RETURN QUERY UPDATE jobq.jobs j
        SET status = 'waiting', attempts = j.attempts - 1, lease_token = NULL, lease_expires_at = NULL,
            worker_id = NULL, updated_at = now(), run_at = now() + make_interval(secs => p_timeout),
            sleep_until = NULL, wait_event = p_event
        WHERE j.id = p_id
        RETURNING j.id, j.status, j.run_at, NULL::bigint;
        IF v_job.key IS NOT NULL THEN  -- its key's slot is free: a job of that key may go (flow control)
            PERFORM pg_notify('jobq', json_build_object(
                'queue', p_queue, 'n', 1, 'run_at', extract(epoch FROM now()))::text);
        END IF;
    END IF;
END
$$;
"""
SEND_EVENT = r"""
CREATE OR REPLACE FUNCTION jobq.send_event(
    p_name text, p_payload jsonb DEFAULT NULL, p_scope text[] DEFAULT NULL
) RETURNS TABLE (event_id bigint, woken bigint, queues jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_at timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(1785684581, hashtext(p_name));
    INSERT INTO jobq.events (name, payload, scope, at)
    VALUES (p_name, p_payload, p_scope, clock_timestamp())
    RETURNING jobq.events.id, jobq.events.at INTO v_id, v_at;
    RETURN QUERY WITH reached AS (
        UPDATE jobq.jobs j
        SET status = 'pending', run_at = now(), updated_at = now(), wait_event = NULL, journaled = true,
            sleep_until = now()
        WHERE j.status = 'waiting' AND j.wait_event = p_name
          AND (p_scope IS NULL OR j.queue LIKE ANY (p_scope))
        RETURNING j.id, j.queue
    ), journal AS (
        INSERT INTO jobq.job_journal AS r (job_id, events)
        SELECT id, jsonb_build_array(jsonb_build_object(
                   'id', v_id, 'name', p_name, 'payload', p_payload, 'at', v_at))
        FROM reached
        ON CONFLICT (job_id) DO UPDATE SET events = coalesce(r.events, '[]') || excluded.events
    ), per_queue AS (
        SELECT queue, count(*) AS n FROM reached GROUP BY queue
    ), notified AS (
        SELECT pg_notify('jobq', json_build_object(
                   'queue', queue, 'n', n, 'run_at', extract(epoch FROM now()))::text)
        FROM per_queue
    )
    SELECT v_id, coalesce(sum(n), 0)::bigint, coalesce(jsonb_object_agg(queue, n), '{}')
    FROM per_queue WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;
"""


def _rebuild(held: str) -> None:
    """ix_jobs_key_held over the jobs `held` names, without blocking writes."""
    with op.get_context().autocommit_block():
        build_index(f"{NAME}_next", f"(queue, key, id) {held}")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{NAME}")
        op.execute(f"ALTER INDEX {SCHEMA}.{NAME}_next RENAME TO {NAME}")


def upgrade() -> None:
    for function in (LEASE_FLOW_FRONT, AWAIT_EVENT, SEND_EVENT):
        op.execute(function)
    _rebuild(HELD)


def downgrade() -> None:
    previous = revision_module("0025")
    for function in (previous.LEASE_FLOW_FRONT, previous.AWAIT_EVENT, previous.SEND_EVENT):
        op.execute(function)
    _rebuild(OLD_HELD)
