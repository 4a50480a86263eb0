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
-- context from 0015, `depends_on` and `run_if` from 0023: a job with parents starts `waiting` and is
-- decided by jobq.add_parents() (below) or when its last parent ends; it takes no dedup_key (deciding it
-- later could meet an active job holding the same key).
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
    tracestate text DEFAULT NULL,
    depends_on bigint[] DEFAULT NULL,
    run_if text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    IF enqueue.depends_on IS NOT NULL THEN
        IF enqueue.dedup_key IS NOT NULL THEN
            RAISE EXCEPTION 'a job with depends_on takes no dedup_key'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO jobq.jobs
            (queue, payload, priority, run_at, max_attempts, kind, key, traceparent, tracestate, status,
             depends_on, run_if)
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.kind, enqueue.key,
                enqueue.traceparent, enqueue.tracestate, 'waiting', enqueue.depends_on,
                coalesce(enqueue.run_if, 'completed'))
        RETURNING id INTO job_id;
        PERFORM jobq.add_parents(ARRAY[job_id], ARRAY[NULL::double precision]);
        RETURN job_id;
    END IF;
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
-- app/service/flow.py). Made by 0021; `depends_on` among its columns from 0023, `journal` (a job's steps
-- and events from jobq.job_journal, for a job that has some) from 0025, which also has a lease end a job's
-- debounce. With p_per_key (0027), a key whose jobs run in order (concurrency 1) and has nothing running
-- gives up to that many jobs, its first ready one and those right after it (`run`, read in order: one the
-- front passed over, locked elsewhere, ends the run there), held until every one of them has ended.
-- Of a key's jobs that have begun (several, once a run was handed back), the first enqueued holds it: a
-- retry's run_at is its retry's, not its place in the key's order.
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


-- Dependencies (API part 6). A job with parents (`depends_on`) starts `waiting` and is decided once, when
-- its last parent ends (completed, dead, cancelled, or deleted), by the transaction that ended it: no
-- replica, restart or loop is needed for it, and no decision can be lost or made twice. The bookkeeping:
-- jobq.job_edges holds one row per (parent, child) whose parent has not ended yet; jobq.job_waits one
-- row per waiting child, with how many of its parents have yet to end. A parent's end deletes its edges
-- and counts its children down under their job_waits rows' locks (so two parents ending at once, on two
-- replicas, count one after the other), and the transaction that counts a child to zero decides it.
-- `has_children` marks a job that has (or had) edges, so that the triggers below fire for it alone: a
-- job without children pays the trigger's WHEN and nothing more. Made by 0023.

-- jobq.decide(): decide the children `p_children` whose parents have all ended, each given with the first
-- of its parents that did not complete (`p_failed`, and its status in `p_failed_status`; NULL: all
-- completed), its last parent (`p_last`) and the `delay` it was enqueued with (`p_delays`, counted from
-- now; NULL: none), each by its `run_if`: `completed` runs it when every parent completed, `finished`
-- whatever they ended as, `failed` when one at least is dead or cancelled. Run: pending, at now + its
-- delay (else at its run_at, or now if that passed), the queue's long-polls woken as for a new job. Not
-- run: cancelled (moved to jobq.jobs_history as every cancelled job is), `last_error` naming the parent
-- that decided it, and its waiters woken. A child no longer waiting (cancelled meanwhile) is left as it
-- is. Returns the cancelled jobs that have children of their own, to be ended in turn
-- (jobq.parents_ended()). A cancelled job of a workflow wakes the workflow's waiters, as
-- jobq.job_ending() does. Its callers decide each child once: jobq.parents_ended(), for the one
-- transaction that ended its last parent, and jobq.add_parents(), for a child whose parents had all ended.
CREATE OR REPLACE FUNCTION jobq.decide(
    p_children bigint[], p_failed bigint[], p_failed_status text[], p_last bigint[],
    p_delays double precision[]
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_cancelled bigint[];
BEGIN
    IF coalesce(cardinality(p_children), 0) = 0 THEN
        RETURN '{}';
    END IF;
    WITH c AS (
        SELECT d.*, CASE j.run_if WHEN 'finished' THEN true WHEN 'failed' THEN d.failed_parent IS NOT NULL
                                  ELSE d.failed_parent IS NULL END AS go
        FROM unnest(p_children, p_failed, p_failed_status, p_last, p_delays)
             AS d(job_id, failed_parent, failed_status, last_parent, start_delay)
        JOIN jobq.jobs j ON j.id = d.job_id AND j.status = 'waiting'
    ), started AS (
        UPDATE jobq.jobs j
        SET status = 'pending', updated_at = now(),
            run_at = CASE WHEN c.start_delay IS NULL THEN greatest(j.run_at, now())
                          ELSE now() + make_interval(secs => c.start_delay) END
        FROM c WHERE j.id = c.job_id AND c.go
        RETURNING j.queue, j.run_at
    ), woken AS (
        SELECT pg_notify('jobq', json_build_object(
                   'queue', queue, 'n', count(*), 'run_at', extract(epoch FROM min(run_at)))::text)
        FROM started GROUP BY queue
    ), taken AS (
        DELETE FROM jobq.jobs j USING c
        WHERE j.id = c.job_id AND NOT c.go
        RETURNING j.*, CASE WHEN c.failed_parent IS NULL
                            THEN format('cancelled: no parent failed (run_if failed; the last was job %s)',
                                        c.last_parent)
                            ELSE format('cancelled: parent job %s is %s (run_if %s)',
                                        c.failed_parent, c.failed_status, j.run_if) END AS reason
    ), cancelled AS (
        INSERT INTO jobq.jobs_history AS j
            (id, queue, status, payload, priority, run_at, attempts, max_attempts, dedup_key, last_error,
             lease_token, lease_expires_at, worker_id, created_at, updated_at, completed_at,
             message_attributes, first_received_at, kind, result, progress, awaited, key, schedule,
             schedule_slot, traceparent, tracestate, depends_on, run_if, workflow_id, has_children,
             debounce_key, debounce_until, purge_after)
        SELECT m.id, m.queue, 'cancelled', m.payload, m.priority, m.run_at, m.attempts, m.max_attempts,
               m.dedup_key, m.reason, m.lease_token, m.lease_expires_at, m.worker_id, m.created_at, now(),
               now(), m.message_attributes, m.first_received_at, m.kind, m.result, m.progress, m.awaited,
               m.key, m.schedule, m.schedule_slot, m.traceparent, m.tracestate, m.depends_on, m.run_if,
               m.workflow_id, m.has_children, m.debounce_key, m.debounce_until,
               now() + make_interval(secs => coalesce(r.retention, 86400.0))
        FROM taken m LEFT JOIN jobq.queues r ON r.name = m.queue
        RETURNING j.id, j.has_children,
                  CASE WHEN j.awaited THEN pg_notify('jobq_done', j.id::text) END AS done,
                  CASE WHEN j.workflow_id IS NOT NULL
                       THEN pg_notify('jobq_done', 'w' || j.workflow_id) END AS workflow_done
    )
    SELECT coalesce(array_agg(id) FILTER (WHERE has_children), '{}') INTO v_cancelled
    FROM cancelled WHERE (SELECT count(*) FROM woken) >= 0;
    RETURN v_cancelled;
END
$$;


-- jobq.parents_ended(): the parents `p_parents` ended (or are gone): take their edges, decide the
-- children whose last parent this was (jobq.decide()), and go on with the children that this cancelled,
-- until no job is left to end (a loop, not a trigger calling itself: a chain of a thousand cancellations
-- stays one level deep). A parent's status is read as it is now; one that is nowhere was deleted, and
-- counts as cancelled. A child of one parent (and no delay) has no job_waits row: the edge it had was its
-- only one, and the transaction that deleted it decides it. A child of several has one, counted down
-- here; its rows are locked in id order first, so two parents ending at once wait for each other instead
-- of deadlocking, and the one that counts it to zero deletes the row and decides the child.
CREATE OR REPLACE FUNCTION jobq.parents_ended(p_parents bigint[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_frontier bigint[] := p_parents;
    v_children bigint[];
    v_parents bigint[];
    v_statuses text[];
    v_ready bigint[];
    v_failed bigint[];
    v_failed_status text[];
    v_last bigint[];
    v_delays double precision[];
BEGIN
    WHILE coalesce(cardinality(v_frontier), 0) > 0 LOOP
        WITH gone AS (
            DELETE FROM jobq.job_edges WHERE parent_id = ANY(v_frontier) RETURNING parent_id, child_id
        )
        SELECT array_agg(g.child_id ORDER BY g.child_id, g.parent_id),
               array_agg(g.parent_id ORDER BY g.child_id, g.parent_id),
               array_agg(coalesce(a.status, 'cancelled') ORDER BY g.child_id, g.parent_id)
        INTO v_children, v_parents, v_statuses
        FROM gone g LEFT JOIN jobq.all_jobs a ON a.id = g.parent_id;
        EXIT WHEN v_children IS NULL;
        PERFORM 1 FROM jobq.job_waits WHERE job_id = ANY(v_children) ORDER BY job_id FOR UPDATE;
        IF NOT FOUND THEN  -- children of one parent each: this one, whose end decides them
            SELECT array_agg(CASE WHEN status <> 'completed' THEN parent_id END ORDER BY n),
                   array_agg(CASE WHEN status <> 'completed' THEN status END ORDER BY n)
            INTO v_failed, v_failed_status
            FROM unnest(v_parents, v_statuses) WITH ORDINALITY AS e(parent_id, status, n);
            v_frontier := jobq.decide(v_children, v_failed, v_failed_status, v_parents, NULL);
            CONTINUE;
        END IF;
        WITH per_child AS (
            SELECT child_id, count(*) AS n, max(parent_id) AS last_parent,
                   (array_agg(parent_id ORDER BY parent_id) FILTER (WHERE status <> 'completed'))[1]
                       AS failed_parent,
                   (array_agg(status ORDER BY parent_id) FILTER (WHERE status <> 'completed'))[1]
                       AS failed_status
            FROM unnest(v_children, v_parents, v_statuses) AS e(child_id, parent_id, status)
            GROUP BY child_id
        ), counted AS (
            UPDATE jobq.job_waits w
            SET parents_left = w.parents_left - p.n, last_parent = p.last_parent,
                failed_parent = coalesce(w.failed_parent, p.failed_parent),
                failed_status = CASE WHEN w.failed_parent IS NULL THEN p.failed_status
                                     ELSE w.failed_status END
            FROM per_child p WHERE w.job_id = p.child_id AND w.parents_left > p.n
            RETURNING w.job_id
        ), done AS (
            DELETE FROM jobq.job_waits w USING per_child p
            WHERE w.job_id = p.child_id AND w.parents_left <= p.n
            RETURNING w.job_id, coalesce(w.failed_parent, p.failed_parent) AS failed_parent,
                      CASE WHEN w.failed_parent IS NULL THEN p.failed_status ELSE w.failed_status END
                          AS failed_status,
                      p.last_parent, w.start_delay
        ), ready AS (
            SELECT * FROM done
            UNION ALL
            SELECT p.child_id, p.failed_parent, p.failed_status, p.last_parent, NULL FROM per_child p
            WHERE p.child_id NOT IN (SELECT job_id FROM counted UNION ALL SELECT job_id FROM done)
        )
        SELECT array_agg(job_id), array_agg(failed_parent), array_agg(failed_status), array_agg(last_parent),
               array_agg(start_delay)
        INTO v_ready, v_failed, v_failed_status, v_last, v_delays FROM ready;
        v_frontier := jobq.decide(v_ready, v_failed, v_failed_status, v_last, v_delays);
    END LOOP;
END
$$;


-- jobq.add_parents(): link new `waiting` jobs (`p_children`, each with its `depends_on`) to their parents,
-- in the transaction that inserts them. Parents that have not ended are locked first (FOR NO KEY UPDATE,
-- in id order): a parent's end under way is waited for, and one that comes after waits for this
-- transaction and then finds its edges, so no end is missed. A statement that ends parents (an ack of a
-- hundred) takes their rows in the order its plan meets them, which may not be id order: it could wait
-- for a parent this holds while holding one this waits for. So this waits at most 200 ms for a parent
-- (lock_timeout, well under deadlock_timeout), and gives up (lock_not_available) rather than deadlock
-- the end, whose client would be answered 503; the service makes the jobs again in a new transaction
-- (app/service/inserts.py, linked), a caller in SQL retries as it would any lock timeout. Parents that ended already count at once:
-- a child whose parents have all ended is decided here. `p_delays`, one per child: the `delay` it was
-- enqueued with, counted from its decision (NULL: none). A child left waiting gets a job_waits row when
-- it has several parents or a delay (jobq.parents_ended() counts it down); one with a single parent and
-- no delay needs none. An id that is no job raises
-- foreign_key_violation, the ids in its DETAIL (the service answers 422 naming them).
CREATE OR REPLACE FUNCTION jobq.add_parents(p_children bigint[], p_delays double precision[])
RETURNS void
LANGUAGE plpgsql SET lock_timeout = '200ms' AS $$
DECLARE
    v_parents bigint[];
    v_live bigint[];
    v_unknown bigint[];
    v_ready bigint[];
    v_failed bigint[];
    v_failed_status text[];
    v_last bigint[];
    v_delays double precision[];
BEGIN
    SELECT array_agg(DISTINCT p) INTO v_parents
    FROM jobq.jobs c CROSS JOIN LATERAL unnest(c.depends_on) p WHERE c.id = ANY(p_children);
    SELECT coalesce(array_agg(id), '{}') INTO v_live FROM (
        SELECT id FROM jobq.jobs
        WHERE id = ANY(v_parents) AND status IN ('pending', 'running', 'waiting')
        ORDER BY id FOR NO KEY UPDATE
    ) l;
    UPDATE jobq.jobs SET has_children = true WHERE id = ANY(v_live) AND NOT has_children;
    WITH pairs AS (
        SELECT DISTINCT d.child, p AS parent, d.delay, p = ANY(v_live) AS live
        FROM unnest(p_children, p_delays) AS d(child, delay)
        JOIN jobq.jobs c ON c.id = d.child CROSS JOIN LATERAL unnest(c.depends_on) p
    ), linked AS (
        INSERT INTO jobq.job_edges (parent_id, child_id) SELECT parent, child FROM pairs WHERE live
    ), ended AS (
        SELECT pairs.*, a.status FROM pairs LEFT JOIN jobq.all_jobs a ON a.id = pairs.parent AND NOT live
    ), unknown AS (
        SELECT array_agg(DISTINCT parent) AS ids FROM ended WHERE NOT live AND status IS NULL
    ), per_child AS (
        SELECT child, count(*) AS parents, count(*) FILTER (WHERE live) AS parents_left,
               (array_agg(parent ORDER BY parent) FILTER (WHERE status <> 'completed'))[1] AS failed_parent,
               (array_agg(status ORDER BY parent) FILTER (WHERE status <> 'completed'))[1] AS failed_status,
               max(parent) FILTER (WHERE NOT live) AS last_parent, min(delay) AS delay
        FROM ended GROUP BY child
    ), waits AS (
        INSERT INTO jobq.job_waits (job_id, parents_left, failed_parent, failed_status, last_parent,
                                    start_delay)
        SELECT child, parents_left, failed_parent, failed_status, last_parent, delay FROM per_child
        WHERE parents_left > 0 AND (parents > 1 OR delay IS NOT NULL)
    ), ready AS (
        SELECT * FROM per_child WHERE parents_left = 0
    )
    SELECT (SELECT ids FROM unknown), array_agg(child), array_agg(failed_parent), array_agg(failed_status),
           array_agg(last_parent), array_agg(delay)
    INTO v_unknown, v_ready, v_failed, v_failed_status, v_last, v_delays FROM ready;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on names jobs that do not exist: %', array_to_string(v_unknown, ', ')
            USING ERRCODE = 'foreign_key_violation', DETAIL = array_to_string(v_unknown, ',');
    END IF;
    PERFORM jobq.parents_ended(jobq.decide(v_ready, v_failed, v_failed_status, v_last, v_delays));
END
$$;


-- The end of a job that has children or belongs to a workflow: its row goes dead (NACK, EXPIRE_LEASES) or
-- leaves jobq.jobs (completed or cancelled into jobs_history, or deleted). Children are decided once per
-- statement, for all the parents it ended, not once per parent: an ack of a hundred parents counts their
-- children down in a few set-wide statements, where a hundred calls took a millisecond each.
--
-- jobq.job_ending(), before each such row changes: a parent's id is noted in the transaction's setting
-- `jobq.ended`, and the waiters of a workflow (GET /workflows/{id}?wait) are notified on DONE_CHANNEL
-- ('w' and its id; delivered at commit, once per workflow and transaction). Only for jobs with children
-- or a workflow: any other pays the WHEN alone. Not for the statements jobq.parents_ended() runs itself
-- (pg_trigger_depth() > 0): its loop ends the jobs it cancels.
CREATE OR REPLACE FUNCTION jobq.job_ending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.has_children THEN
        PERFORM set_config('jobq.ended', coalesce(current_setting('jobq.ended', true), '') || OLD.id || ',',
                           true);
    END IF;
    IF OLD.workflow_id IS NOT NULL THEN
        PERFORM pg_notify('jobq_done', 'w' || OLD.workflow_id);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;


-- jobq.jobs_ended(), after a statement that noted parents: their children counted down and decided
-- (jobq.parents_ended()), with the statement's changes in sight (a parent's status read where it moved
-- to). Its WHEN reads the setting alone: a statement that ended no parent calls no function.
CREATE OR REPLACE FUNCTION jobq.jobs_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_ended bigint[] := string_to_array(rtrim(current_setting('jobq.ended', true), ','), ',')::bigint[];
BEGIN
    PERFORM set_config('jobq.ended', '', true);
    PERFORM jobq.parents_ended(v_ended);
    RETURN NULL;
END
$$;


CREATE TRIGGER job_dead BEFORE UPDATE OF status ON jobq.jobs
    FOR EACH ROW WHEN (NEW.status = 'dead' AND OLD.status <> 'dead'
                       AND (NEW.has_children OR NEW.workflow_id IS NOT NULL) AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION jobq.job_ending();
CREATE TRIGGER job_gone BEFORE DELETE ON jobq.jobs
    FOR EACH ROW WHEN ((OLD.has_children OR OLD.workflow_id IS NOT NULL) AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION jobq.job_ending();
CREATE TRIGGER jobs_ended AFTER UPDATE OR DELETE ON jobq.jobs
    FOR EACH STATEMENT WHEN (current_setting('jobq.ended', true) <> '')
    EXECUTE FUNCTION jobq.jobs_ended();


-- jobq.retry_workflow(): resume a failed workflow where it failed. Its dead jobs go back to pending
-- (attempts reset, ready now), and its jobs that a parent's end cancelled (jobq.decide() wrote their
-- last_error) back to waiting, linked to their parents again (jobq.add_parents()), to be decided when
-- those end. Jobs cancelled otherwise (DELETE /jobs/{id}, DELETE /workflows/{id}) stay cancelled. Returns
-- how many jobs it reopened. Made by 0023.
CREATE OR REPLACE FUNCTION jobq.retry_workflow(p_workflow bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_dead integer;
    v_reopened bigint[];
BEGIN
    WITH retried AS (
        UPDATE jobq.jobs
        SET status = 'pending', attempts = 0, run_at = now(), lease_token = NULL, lease_expires_at = NULL,
            updated_at = now()
        WHERE workflow_id = p_workflow AND status = 'dead'
        RETURNING queue, run_at
    ), woken AS (
        SELECT pg_notify('jobq', json_build_object(
                   'queue', queue, 'n', count(*), 'run_at', extract(epoch FROM min(run_at)))::text)
        FROM retried GROUP BY queue
    )
    SELECT count(*) INTO v_dead FROM retried WHERE (SELECT count(*) FROM woken) >= 0;
    WITH taken AS (
        DELETE FROM jobq.jobs_history
        WHERE workflow_id = p_workflow AND status = 'cancelled' AND depends_on IS NOT NULL
          AND last_error LIKE 'cancelled: %' AND purge_after > now()
        RETURNING *
    ), reopened AS (
        INSERT INTO jobq.jobs
            (id, queue, status, payload, priority, run_at, attempts, max_attempts, dedup_key, last_error,
             lease_token, lease_expires_at, worker_id, created_at, updated_at, completed_at,
             message_attributes, first_received_at, kind, result, progress, awaited, key, schedule,
             schedule_slot, traceparent, tracestate, depends_on, run_if, workflow_id, has_children,
             debounce_key, debounce_until)
        SELECT id, queue, 'waiting', payload, priority, run_at, attempts, max_attempts, dedup_key, NULL,
               NULL, NULL, worker_id, created_at, now(), NULL, message_attributes, first_received_at, kind,
               NULL, progress, awaited, key, schedule, schedule_slot, traceparent, tracestate, depends_on,
               run_if, workflow_id, has_children, debounce_key, debounce_until
        FROM taken
        RETURNING id
    )
    SELECT array_agg(id) INTO v_reopened FROM reopened;
    IF v_reopened IS NOT NULL THEN
        PERFORM jobq.add_parents(
            v_reopened, array_fill(NULL::double precision, ARRAY[cardinality(v_reopened)]));
    END IF;
    RETURN v_dead + coalesce(cardinality(v_reopened), 0);
END
$$;


-- Events (API part 8): a job parks `waiting` for an event by name (POST /jobs/{id}/await), and an event
-- (POST /events, or jobq.send_event() in the caller's own transaction) makes every job awaiting its name
-- pending. Events are kept (jobq.events, pruned after JOBQ_EVENT_RETENTION), so an event sent before the
-- await is not lost: an await finds it and the job is not parked at all. The two take the event name's
-- advisory lock (class 'jobe', 1785684581) before they look, each statement after it with a snapshot of its
-- own (READ COMMITTED, a volatile function): whichever comes second sees what the first did, so no event
-- and no await pass each other unseen, however many replicas take them at once. A job gets each event
-- once: what reached it is appended to its `events` ({id, name, payload, at}) in jobq.job_journal (the
-- job's row marked `journaled`), and an await looks only at events of its name sent since the job was
-- enqueued that are not there yet, the oldest first. Sending
-- takes `at` from clock_timestamp(), after the lock: a job enqueued by a transaction that committed before
-- the event was sent has a created_at before it. Made by 0025.

-- jobq.await_event(): end the lease `p_lease_token` of job `p_id` (running, in `p_queue`) and park it
-- waiting for an event named `p_event` for at most `p_timeout` seconds (its run_at holds the deadline;
-- EXPIRE_WAITS makes it pending once past), the attempt not counted; or, when such an event was sent
-- since it was enqueued and has not reached it yet, make it pending at once with that event. A row: the
-- job's id, its new status, run_at, and the id of the event that reached it (NULL: parked); no row when
-- the lease is not the job's current one.
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


-- jobq.send_event(): keep an event named `p_name` with `p_payload`, and make every job awaiting that name
-- pending now, the event appended to its `events`; `p_scope` (LIKE patterns of queues; NULL: all) limits
-- both to the queues of a token limited to some (an event it sent never reaches a job outside them).
-- Returns the event's id, how many jobs it woke, and how many in each queue ({queue: n}). Callable in a producer's own transaction: the event
-- is sent when it commits.
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
