-- Every SQL function (and trigger) of jobq's schema as the migrations leave it at their head, in the
-- order they must be created, each with what it does and why: the one place to read a function's current
-- body, which the revisions otherwise hold in pieces (jobq.enqueue() was made by 0001 and replaced by
-- 0003, 0004, 0008 and 0015). Bodies are as the database holds them, character for character.
--
-- A new revision that changes a function (or a trigger) copies its body from here: change it here first,
-- then write the revision's CREATE OR REPLACE FUNCTION with this text (DROP and CREATE in one
-- transaction for a new argument list: revision 0004 says why). A revision that adds one adds it here,
-- in its place in the order. tests/service/test_functions_sql.py migrates a database to head and runs this file
-- into another, and fails when a function or trigger differs between them, or is in one and not the
-- other. Released revisions are never edited to match: this file follows them.


-- jobq.enqueue(): enqueue inside the caller's own transaction, so the job exists exactly when the
-- caller's writes commit. Returns the new job's id, or the id of the pending or running job already
-- holding `dedup_key`. As every enqueue of the service does, it takes its queue's lock shared
-- (QUEUE_LOCK_CLASS, app/db/sql/fragments.py: a DeleteQueue waits for the caller to commit), creates the
-- queue on first use, and wakes waiting workers with the service's NOTIFY (CHANNEL), delivered when the
-- caller commits; a duplicate sends none. New parameters go last, defaulted, so existing calls run
-- unchanged. Made by 0001; the queue lock from 0003, `kind` from 0004, `key` from 0008, the trace
-- context from 0015.
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    kind text DEFAULT NULL,
    key text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    LOOP
        INSERT INTO jobq.jobs
            (queue, payload, priority, run_at, max_attempts, dedup_key, kind, key, traceparent, tracestate)
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.dedup_key,
                enqueue.kind, enqueue.key, enqueue.traceparent, enqueue.tracestate)
        ON CONFLICT (queue, dedup_key) WHERE status IN ('pending', 'running') AND dedup_key IS NOT NULL
        DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NOT NULL THEN
            PERFORM pg_notify('jobq', json_build_object(
                'queue', enqueue.queue, 'n', 1,
                'run_at', extract(epoch FROM coalesce(enqueue.run_at, now())))::text);
            RETURN job_id;
        END IF;
        -- A duplicate: answer with the active holder. It may finish between the two statements; then
        -- the key is free again and the insert is retried.
        SELECT id INTO job_id FROM jobq.jobs j
        WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
          AND j.status IN ('pending', 'running');
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
    END LOOP;
END
$$;


-- jobq.lease_flow_front(): the claim from the front of a queue under key concurrency alone
-- (LEASE_FLOW_FRONT, app/db/sql/claim.py; app/service/flow.py), its two statements in one call: one round
-- trip instead of four. The first (FRONT in revision 0021) locks the first p_lookahead ready jobs in
-- lease order and tries their keys' advisory locks; the second (LEASE there), whose snapshot begins once
-- those locks are held (each statement of a volatile PL/pgSQL function takes its own under READ
-- COMMITTED), leases the jobs within their key's room. Rows as LEASE's, each with its slot, and on every
-- row (on one row of NULL jobs when nothing was leased) how many jobs it `looked` at and how many it
-- `passed` over because another claim held their key. Runs under the claims' plan settings (FLOW_PLANS,
-- app/service/flow.py). Made by 0021.
CREATE OR REPLACE FUNCTION jobq.lease_flow_front(
    p_queue text, p_lookahead integer, p_visibility_timeouts double precision[], p_worker_ids text[]
) RETURNS TABLE (
    id bigint, queue text, kind text, key text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, run_at timestamptz, created_at timestamptz, last_error text, lease_token uuid,
    lease_expires_at timestamptz, traceparent text, tracestate text, slot bigint, looked integer,
    passed integer
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
                    WHERE h.queue = p_queue AND h.key = f.key AND h.status = 'pending' AND h.attempts > 0
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
        worker_id = (p_worker_ids::text[])[ready.slot], updated_at = now()
    FROM ready, q
    WHERE j.id = ready.id AND j.status = 'pending'
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
              coalesce(j.max_attempts, q.max_attempts, 5) AS max_attempts, j.run_at, j.created_at,
              j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate, ready.slot
) SELECT leased.*, n_looked, n_passed FROM leased;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::integer,
            NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::uuid,
            NULL::timestamptz, NULL::text, NULL::text, NULL::bigint, n_looked, n_passed;
    END IF;
END
$$;
