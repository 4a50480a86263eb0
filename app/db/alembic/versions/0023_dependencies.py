"""Dependencies and workflows: a job may wait for others (`depends_on`, `run_if`), in the new status
`waiting`, and is decided once, by the transaction that ends its last parent; jobs made together by POST
/workflows (API part 6)

Expand only: four columns on jobs and jobs_history (nullable, or NOT NULL with a constant default: no
rewrite), the all_jobs view with them (appended, so CREATE OR REPLACE keeps the view's other columns),
two tables of bookkeeping (job_edges, job_waits), the workflows table, an `answer` column on
idempotency_keys (a workflow's kept answer), the status CHECK with `waiting` and two new CHECKs added NOT
VALID and validated after the step's exclusive lock is gone, the functions that decide children, two
triggers on jobs, jobq.enqueue() with two trailing parameters more, defaulted, so that every existing call
runs as before (dropped and created in one transaction: revision 0004 says why), jobq.lease_flow_front()
with `depends_on` among its columns (dropped and created: its result type changes), and
jobq.retry_workflow(). The partial indexes of waiting jobs and of workflows' jobs are built CONCURRENTLY
outside the step's transaction.

Code of revision 0014 runs on this schema unchanged: it never writes the new columns, and no job of its
making has children or parents. A job with parents that a newer replica enqueued is `waiting`, which an
older replica's claims never take (they take `pending` jobs) and whose counts it leaves out. The deciding
is the database's (the triggers), so a parent acked by an older replica decides its children too.

Revision ID: 0023
Revises: 0022
Create Date: 2027-05-02
"""

from alembic import op

from app.db.migrations import build_partitioned_index, lock_tables

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0022's floor).
compatible_from = "0014"

SCHEMA = "jobq"

# The status CHECK as 0001 named it (the models' naming convention added its prefix once more), made again
# under the name the models give it.
STATUSES = "'pending', 'running', 'completed', 'dead', 'cancelled'"
COLUMNS = """
    ADD COLUMN IF NOT EXISTS depends_on bigint[],
    ADD COLUMN IF NOT EXISTS run_if text,
    ADD COLUMN IF NOT EXISTS workflow_id bigint,
    ADD COLUMN IF NOT EXISTS has_children boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS debounce_key text,
    ADD COLUMN IF NOT EXISTS debounce_until timestamptz"""
# The CHECKs, NOT VALID: new rows are checked at once, and the ALTER, which holds ACCESS EXCLUSIVE on
# jobs, scans nothing. Each part is idempotent: the step runs again from the start when a validation
# (after this part committed) times out on its lock.
ADD = f"""
ALTER TABLE {SCHEMA}.jobs {COLUMNS},
    DROP CONSTRAINT IF EXISTS ck_jobs_ck_jobs_status_known,
    DROP CONSTRAINT IF EXISTS ck_jobs_status_known,
    ADD CONSTRAINT ck_jobs_status_known CHECK (status IN ({STATUSES}, 'waiting')) NOT VALID,
    DROP CONSTRAINT IF EXISTS ck_jobs_run_if_known,
    ADD CONSTRAINT ck_jobs_run_if_known CHECK (run_if IN ('completed', 'finished', 'failed')) NOT VALID,
    DROP CONSTRAINT IF EXISTS ck_jobs_depends_on_size,
    ADD CONSTRAINT ck_jobs_depends_on_size
        CHECK (cardinality(depends_on) BETWEEN 1 AND 1000) NOT VALID
"""
ADD_HISTORY = f"ALTER TABLE {SCHEMA}.jobs_history {COLUMNS}"
# Waiting jobs per queue (GET /jobs?status=waiting, the gauges), and a workflow's jobs in either table,
# built without blocking writes.
WAITING_INDEX = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_waiting ON {SCHEMA}.jobs (queue, id)"
    " WHERE status = 'waiting'"
)
DEBOUNCE_INDEX = (
    f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS uq_jobs_debounce ON {SCHEMA}.jobs (queue, debounce_key)"
    " WHERE status = 'pending' AND debounce_key IS NOT NULL"
)
WORKFLOW_INDEX = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_workflow ON {SCHEMA}.jobs (workflow_id)"
    " WHERE workflow_id IS NOT NULL"
)
VALIDATE = [
    f"ALTER TABLE {SCHEMA}.jobs VALIDATE CONSTRAINT {name}"
    for name in ("ck_jobs_status_known", "ck_jobs_run_if_known", "ck_jobs_depends_on_size")
]

# The view as 0016 made it, the new columns appended.
NAMES = (
    "id, queue, status, payload, priority, run_at, attempts, max_attempts, dedup_key, last_error, "
    "lease_token, lease_expires_at, worker_id, created_at, updated_at, completed_at, message_attributes, "
    "first_received_at, kind, result, progress, awaited, schedule, schedule_slot, key, traceparent, "
    "tracestate"
)
NEW_NAMES = "depends_on, run_if, workflow_id, has_children, debounce_key, debounce_until"


def view(extra: str) -> str:
    return f"""
CREATE OR REPLACE VIEW {SCHEMA}.all_jobs AS
SELECT * FROM (
    SELECT {NAMES}, NULL::timestamptz AS purge_after{extra} FROM {SCHEMA}.jobs
    UNION ALL
    SELECT {NAMES}, purge_after{extra} FROM {SCHEMA}.jobs_history
) j
WHERE purge_after IS NULL OR purge_after > now()
"""


TRIGGERS = ("job_dead", "job_gone", "jobs_ended")

TABLES = [
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.workflows (
    id bigint GENERATED BY DEFAULT AS IDENTITY,
    name text,
    status text DEFAULT 'running' NOT NULL,
    refs text[] NOT NULL,
    job_ids bigint[] NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    finished_at timestamptz,
    CONSTRAINT pk_workflows PRIMARY KEY (id),
    CONSTRAINT ck_workflows_status_known CHECK (status IN ('running', 'completed', 'failed', 'cancelled'))
)""",
    f"CREATE INDEX IF NOT EXISTS ix_workflows_status ON {SCHEMA}.workflows (status, id)",
    f"CREATE INDEX IF NOT EXISTS ix_workflows_finished ON {SCHEMA}.workflows (finished_at)"
    " WHERE status <> 'running'",
    f"ALTER TABLE {SCHEMA}.idempotency_keys ADD COLUMN IF NOT EXISTS answer text",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.job_edges (
    parent_id bigint NOT NULL,
    child_id bigint NOT NULL,
    CONSTRAINT pk_job_edges PRIMARY KEY (parent_id, child_id)
)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.job_waits (
    job_id bigint NOT NULL,
    parents_left integer NOT NULL,
    failed_parent bigint,
    failed_status text,
    last_parent bigint,
    start_delay double precision,
    CONSTRAINT pk_job_waits PRIMARY KEY (job_id)
)""",
]

OLD_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text, text, text, text)"
NEW_SIGNATURE = (
    "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text, text, text, text, bigint[], text)"
)

# jobq.enqueue() and the functions and triggers of dependencies, as app/db/functions.sql has them at
# this revision.
ENQUEUE = r"""
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
"""

FUNCTIONS = [
    r"""
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
""",
    r"""
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
""",
    r"""
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
""",
    r"""
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
""",
    r"""
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
""",
    r"""
CREATE TRIGGER job_dead BEFORE UPDATE OF status ON jobq.jobs
    FOR EACH ROW WHEN (NEW.status = 'dead' AND OLD.status <> 'dead'
                       AND (NEW.has_children OR NEW.workflow_id IS NOT NULL) AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION jobq.job_ending();
""",
    r"""
CREATE TRIGGER job_gone BEFORE DELETE ON jobq.jobs
    FOR EACH ROW WHEN ((OLD.has_children OR OLD.workflow_id IS NOT NULL) AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION jobq.job_ending();
""",
    r"""
CREATE TRIGGER jobs_ended AFTER UPDATE OR DELETE ON jobq.jobs
    FOR EACH STATEMENT WHEN (current_setting('jobq.ended', true) <> '')
    EXECUTE FUNCTION jobq.jobs_ended();
""",
    r"""
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
""",
]

# jobq.lease_flow_front() hands out `depends_on` too (the service fetches the parents' results of the jobs
# that have some): its result type changes, so it is dropped and made again.
LEASE_FLOW_FRONT_SIGNATURE = "jobq.lease_flow_front(text, integer, double precision[], text[])"
LEASE_FLOW_FRONT = r"""
CREATE OR REPLACE FUNCTION jobq.lease_flow_front(
    p_queue text, p_lookahead integer, p_visibility_timeouts double precision[], p_worker_ids text[]
) RETURNS TABLE (
    id bigint, queue text, kind text, key text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, run_at timestamptz, created_at timestamptz, last_error text, lease_token uuid,
    lease_expires_at timestamptz, traceparent text, tracestate text, depends_on bigint[], slot bigint,
    looked integer, passed integer
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
              j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate, j.depends_on,
              ready.slot
) SELECT leased.*, n_looked, n_passed FROM leased;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::integer,
            NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::uuid,
            NULL::timestamptz, NULL::text, NULL::text, NULL::bigint[], NULL::bigint, n_looked, n_passed;
    END IF;
END
$$;
"""
OLD_LEASE_FLOW_FRONT = r"""
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
"""

# jobq.enqueue() as revision 0015 left it, for the downgrade.
OLD_ENQUEUE = r"""
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
"""


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD)
    op.execute(ADD_HISTORY)
    op.execute(view(f", {NEW_NAMES}"))
    for table in TABLES:
        op.execute(table)
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
    op.execute(ENQUEUE)
    op.execute(f"DROP FUNCTION IF EXISTS {LEASE_FLOW_FRONT_SIGNATURE}")
    op.execute(LEASE_FLOW_FRONT)
    for trigger in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {SCHEMA}.jobs")
    for statement in FUNCTIONS:
        op.execute(statement)
    # Commits the part above (releasing its lock), then validates outside any transaction.
    with op.get_context().autocommit_block():
        for statement in VALIDATE:
            op.execute(statement)
        op.execute(WAITING_INDEX)
        op.execute(WORKFLOW_INDEX)
        op.execute(DEBOUNCE_INDEX)
        build_partitioned_index(
            "jobs_history", "ix_jobs_history_workflow", "(workflow_id) WHERE workflow_id IS NOT NULL"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for index in ("ix_jobs_waiting", "ix_jobs_workflow", "uq_jobs_debounce"):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{index}")
    lock_tables("jobs")
    for trigger in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {SCHEMA}.jobs")
    for function in (
        "retry_workflow(bigint)",
        "jobs_ended()",
        "job_ending()",
        "add_parents(bigint[], double precision[])",
        "parents_ended(bigint[])",
        "decide(bigint[], bigint[], text[], bigint[], double precision[])",
    ):
        op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.{function}")
    op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
    op.execute(OLD_ENQUEUE)
    op.execute(f"DROP FUNCTION IF EXISTS {LEASE_FLOW_FRONT_SIGNATURE}")
    op.execute(OLD_LEASE_FLOW_FRONT)
    op.execute(f"DROP INDEX IF EXISTS {SCHEMA}.ix_jobs_history_workflow")
    op.execute(f"ALTER TABLE {SCHEMA}.idempotency_keys DROP COLUMN IF EXISTS answer")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.workflows")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.job_waits")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.job_edges")
    # Jobs still waiting have no status the older code knows: they go, cancelled, with a word why.
    op.execute(f"""UPDATE {SCHEMA}.jobs SET status = 'cancelled', completed_at = now(), updated_at = now(),
        last_error = 'cancelled: dependencies are not kept by this version' WHERE status = 'waiting'""")
    op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.all_jobs")
    op.execute(view(""))
    op.execute(f"""ALTER TABLE {SCHEMA}.jobs
        DROP CONSTRAINT IF EXISTS ck_jobs_run_if_known,
        DROP CONSTRAINT IF EXISTS ck_jobs_depends_on_size,
        DROP CONSTRAINT IF EXISTS ck_jobs_status_known,
        ADD CONSTRAINT ck_jobs_ck_jobs_status_known CHECK (status IN ({STATUSES})),
        DROP COLUMN IF EXISTS depends_on, DROP COLUMN IF EXISTS run_if,
        DROP COLUMN IF EXISTS workflow_id, DROP COLUMN IF EXISTS has_children,
        DROP COLUMN IF EXISTS debounce_key, DROP COLUMN IF EXISTS debounce_until""")
    op.execute(f"""ALTER TABLE {SCHEMA}.jobs_history
        DROP COLUMN IF EXISTS depends_on, DROP COLUMN IF EXISTS run_if,
        DROP COLUMN IF EXISTS workflow_id, DROP COLUMN IF EXISTS has_children,
        DROP COLUMN IF EXISTS debounce_key, DROP COLUMN IF EXISTS debounce_until""")
