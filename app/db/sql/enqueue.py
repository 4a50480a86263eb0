"""Enqueues: batches of jobs inserted in one statement, their queues created on first use, and the
active jobs a duplicate dedup_key is answered with.

The enqueues that keep their answer under an idempotency key are in idempotency.py, the scheduler's in
schedules.py; jobq.enqueue(), the SQL function producers call in their own transaction, is in
app/db/functions.sql. Each makes a pending job (app/core/states.py).
"""

from __future__ import annotations

from app.core.limits import DEFAULT_MAX_ATTEMPTS
from app.db.sql.fragments import JOB, LOCKED, NOTIFIED, _notify, _queues_made
from app.db.sql.query import Query

# Insert a batch of jobs that have no dedup_key (one job is a batch of one), creating their queues on
# first use: the common case, and the cheapest statement that does it.
# - Columns go in as arrays, one element per job; a column the whole batch leaves at its default goes in
#   as NULL (unnest pads it with NULLs), so it costs nothing to send.
# - Ids come from the column default, drawn as rows are inserted in request order (ORDER BY ord), so
#   they ascend in request order: the n-th smallest id returned is the n-th job of the request.
# - run_at and delay are resolved on the database clock, like every other deadline.
# - The queues' locks (QUEUE_LOCK_CLASS) are taken before anything is inserted.
# - Only what the database decided comes back, as one row of arrays in id order: the ids, each run_at
#   that is not the insert time (NULL: the job is ready at once), the resolved max_attempts, and the
#   insert time once (every row of a statement shares it). The rest of a new job is what the caller
#   sent (jobs.enqueue_batch builds it), so a batch of 1,000 is not sent back and decoded column by column.
_INSERT_NEW = f"""
    j AS (
        INSERT INTO jobq.jobs AS j
            (queue, payload, priority, run_at, max_attempts, kind, key, traceparent, tracestate)
        SELECT queue, payload::jsonb, coalesce(priority, 0),
               coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))), max_attempts, kind, key,
               traceparent, tracestate
        FROM unnest(:queues::text[], :payloads::text[], :priorities::int[], :run_ats::timestamptz[],
                    :delays::float8[], :max_attempts::int[], :kinds::text[], :job_keys::text[],
                    :traceparents::text[], :tracestates::text[])
             WITH ORDINALITY AS t(queue, payload, priority, run_at, delay, max_attempts, kind, key,
                                  traceparent, tracestate, ord)
        WHERE {LOCKED}
        ORDER BY ord
        RETURNING j.id, j.queue, j.run_at, j.created_at, j.max_attempts
    )"""
# The jobs' queues locked and created on first use, the jobs inserted (`j`), and the wake-up sent.
_ENQUEUE_NEW_CTES = f"""
    WITH {_queues_made("unnest(:queues::text[]) AS t(queue)")}, {_INSERT_NEW}, {_notify("j")}"""
# The answer: one row of arrays, in id order.
_NEW_JOBS_ROW = f"""
    SELECT array_agg(j.id ORDER BY j.id) AS ids,
           array_agg(nullif(j.run_at, j.created_at) ORDER BY j.id) AS run_ats,
           array_agg(coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) ORDER BY j.id)
               AS max_attempts,
           min(j.created_at) AS created_at
    FROM j LEFT JOIN jobq.queues q ON q.name = j.queue"""
ENQUEUE_NEW = Query.define(
    "enqueue_new",
    f"""
    {_ENQUEUE_NEW_CTES}
    {_NEW_JOBS_ROW}
    WHERE {NOTIFIED}
    """,
)

# Insert a batch of jobs some of which have a dedup_key, creating their queues on first use. As
# ENQUEUE_NEW, and:
# - ON CONFLICT DO NOTHING against uq_jobs_dedup: a job whose dedup_key an active job of its queue holds
#   is not inserted; its row comes back with NULL columns and jobs.enqueue_batch looks up the holder.
# - So ids are drawn up front, and each row of the answer is matched to its place in the request by
#   ord, one row per job.
ENQUEUE = Query.define(
    "enqueue",
    f"""
    WITH input AS (
        SELECT nextval('jobq.jobs_id_seq') AS id, t.*
        FROM unnest(:queues::text[], :payloads::text[], :priorities::int[], :run_ats::timestamptz[],
                    :delays::float8[], :max_attempts::int[], :kinds::text[], :job_keys::text[],
                    :traceparents::text[], :tracestates::text[], :dedup_keys::text[])
             WITH ORDINALITY AS t(queue, payload, priority, run_at, delay, max_attempts, kind, key,
                                  traceparent, tracestate, dedup_key, ord)
    ), {_queues_made("input")}, j AS (
        INSERT INTO jobq.jobs AS j
            (id, queue, payload, priority, run_at, max_attempts, kind, key, traceparent, tracestate,
             dedup_key)
        SELECT id, queue, payload::jsonb, coalesce(priority, 0),
               coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))), max_attempts, kind, key,
               traceparent, tracestate, dedup_key
        FROM input WHERE {LOCKED} ORDER BY ord
        ON CONFLICT (queue, dedup_key) WHERE status IN ('pending', 'running') AND dedup_key IS NOT NULL
        DO NOTHING
        RETURNING *
    ), {_notify("j")}
    SELECT input.ord, j.id, j.run_at, j.created_at,
           coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts
    FROM input
    LEFT JOIN j ON j.id = input.id
    LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE {NOTIFIED}
    ORDER BY input.ord
    """,
)

# The active jobs holding these (queue, dedup_key) pairs: what a duplicate enqueue answers with.
DEDUP_HOLDERS = Query.define(
    "dedup_holders",
    f"""
    SELECT {JOB}
    FROM unnest(:queues::text[], :dedup_keys::text[]) AS k(queue, dedup_key)
    JOIN jobq.jobs j ON j.queue = k.queue AND j.dedup_key = k.dedup_key
                    AND j.status IN ('pending', 'running')
    LEFT JOIN jobq.queues q ON q.name = j.queue
    """,
)

# Insert a batch of jobs with parents (`depends_on`), `waiting`: as ENQUEUE_NEW, with each job's parents
# and `run_if`, and no wake-up (none of them is ready). ADD_PARENTS then links them to their parents in the
# same transaction, and decides at once those whose parents have all ended. A job with parents has no
# dedup_key (the API refuses the two together): decided later, it could meet an active job holding it.
# Ids come back in request order, one row per job. :ids, when given, are the jobs' ids, drawn beforehand
# (DRAW_JOB_IDS: a workflow's jobs name each other as parents); NULL draws them here.
ENQUEUE_WAITING = Query.define(
    "enqueue_waiting",
    f"""
    WITH {_queues_made("unnest(:queues::text[]) AS t(queue)")}, j AS (
        INSERT INTO jobq.jobs AS j
            (id, queue, payload, priority, run_at, max_attempts, kind, key, traceparent, tracestate, status,
             depends_on, run_if, workflow_id)
        SELECT coalesce(id, nextval('jobq.jobs_id_seq')), queue, payload::jsonb, coalesce(priority, 0),
               coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))), max_attempts, kind, key,
               traceparent, tracestate, CASE WHEN parents IS NULL THEN 'pending' ELSE 'waiting' END,
               parents, CASE WHEN parents IS NOT NULL THEN coalesce(run_if, 'completed') END, :workflow_id
        FROM unnest(:queues::text[], :payloads::text[], :priorities::int[], :run_ats::timestamptz[],
                    :delays::float8[], :max_attempts::int[], :kinds::text[], :job_keys::text[],
                    :traceparents::text[], :tracestates::text[], :parents::text[], :run_ifs::text[],
                    :ids::bigint[])
             WITH ORDINALITY AS t(queue, payload, priority, run_at, delay, max_attempts, kind, key,
                                  traceparent, tracestate, parents_text, run_if, id, ord)
             CROSS JOIN LATERAL (SELECT parents_text::bigint[] AS parents) p
        WHERE {LOCKED}
        ORDER BY ord
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at, j.max_attempts
    ), {_notify("j", "status = 'pending'")}
    SELECT j.id, j.status, j.run_at, j.created_at,
           coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts
    FROM j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE {NOTIFIED}
    ORDER BY j.id
    """,
)

# Enqueue one job under a debounce key (POST /jobs `debounce`): while a job of the queue with the key is
# pending, the enqueue lands in it, replacing its payload and moving its run_at to now + :seconds, never past
# its debounce_until (its creation + max_seconds); otherwise a new job is made, to run in :seconds.
# uq_jobs_debounce holds one pending job per key, and ON CONFLICT against it makes concurrent enqueues of
# a key land in one job: a job leased meanwhile is running, out of the index, and the enqueue makes a new
# one. `debounced` says which (a row an ON CONFLICT updated has an xmax). A moved job is announced again
# with its new run_at, as a new one is: the timer its first enqueue armed finds nothing due, and without
# this one its waiters would wait for the safety poll.
ENQUEUE_DEBOUNCED = Query.define(
    "enqueue_debounced",
    f"""
    WITH {_queues_made("(SELECT :queue::text AS queue) t")}, j AS (
        INSERT INTO jobq.jobs AS j
            (queue, payload, priority, run_at, max_attempts, kind, key, traceparent, tracestate, debounce_key,
             debounce_until)
        SELECT :queue, :payload::jsonb, coalesce(:priority, 0),
               least(now() + make_interval(secs => :seconds),
                     now() + make_interval(secs => :max_seconds::float8)),
               :max_attempts, :kind, :job_key, :traceparent, :tracestate, :debounce_key,
               now() + make_interval(secs => :max_seconds::float8)
        WHERE {LOCKED}
        ON CONFLICT (queue, debounce_key) WHERE status = 'pending' AND debounce_key IS NOT NULL
        DO UPDATE SET payload = excluded.payload, updated_at = now(),
                      run_at = least(excluded.run_at, coalesce(j.debounce_until, 'infinity'))
        RETURNING j.*, j.xmax <> 0 AS debounced
    ), {_notify("j")}
    SELECT {JOB}, j.debounced FROM j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE {NOTIFIED}
    """,
)
