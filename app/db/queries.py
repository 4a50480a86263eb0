"""Every SQL statement jobq runs, each with a name, a purpose and its reasons.

Statements are written with named parameters (``:queue``); ``Query`` rewrites them once, at import, to
asyncpg's positional ``$n`` and binds arguments by name, so a long statement never depends on argument
order. Each state change names the state it expects (and the lease token, where one fences it) in its
``WHERE`` and uses ``RETURNING``: no row back means the job was not in that state, which is an answer.

The job state machine. A job's status (app/db/tables.py ``JobStatus``) changes only through the statements
of this module, and through ``jobq.enqueue()``, the SQL function producers call in their own transaction
(alembic revision 0004). tests/test_states.py runs each of them against a job in each status and checks
the result against this table, and that no other statement here changes a status.

=========  ==================================================  ============================================
status     led in by                                           led out by
=========  ==================================================  ============================================
pending    ENQUEUE_NEW, ENQUEUE, ENQUEUE_NEW_ONCE,             LEASE, LEASE_FLOW, LEASE_FLOW_RATED,
           ENQUEUE_NEW_EACH_ONCE, jobq.enqueue(), NACK,        LEASE_FLOW_FRONT, CANCEL, CANCEL_JOBS, ACK
           RELEASE, EXPIRE_LEASES, RETRY_DEAD, FIRE_SCHEDULE,  (the last holder, late), PURGE_QUEUE,
           REDRIVE_DEAD (into another queue),                  DELETE_QUEUE, REVIVE_LEASE (the last
           FIRE_DUE_SCHEDULES                                  holder, late)
running    LEASE, LEASE_FLOW, LEASE_FLOW_RATED,                ACK, NACK, RELEASE, EXPIRE_LEASES,
           LEASE_FLOW_FRONT, REVIVE_LEASE                      PURGE_QUEUE, DELETE_QUEUE, EXPIRE_MESSAGES
completed  ACK                                                 PRUNE_HISTORY_DEFAULT (and partitions
                                                               dropped: retention), DELETE_QUEUE
dead       NACK (dead, or out of attempts), EXPIRE_LEASES      RETRY_DEAD, PURGE_DEAD, PURGE_DEAD_JOBS,
           (out of attempts)                                   ACK (the last holder, late), DELETE_QUEUE,
                                                               REDRIVE_DEAD
cancelled  CANCEL, CANCEL_JOBS                                 PRUNE_HISTORY_DEFAULT (and partitions
                                                               dropped: retention), DELETE_QUEUE
=========  ==================================================  ============================================

Completed and cancelled jobs live in jobq.jobs_history (see JOB_COLUMNS), the others in jobq.jobs.
Led out by a DELETE (PURGE_*, PRUNE_HISTORY_DEFAULT, DELETE_QUEUE, EXPIRE_MESSAGES), or when retention
drops a day's partition of jobs_history (app/service/history.py), the row is gone; MOVE_FINISHED moves
finished rows that are still in jobq.jobs and changes no status. EXTEND keeps a running job running,
RUN_NOW a pending job pending, RETURN_DEAD_LETTERS a pending job pending (in another queue). Statuses are
written in the SQL as literals ('pending'): the test checks each is a ``JobStatus``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.core.limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION,
    DEFAULT_VISIBILITY_TIMEOUT,
)
from app.core.states import JobStatus
from app.db.tables import JobHistory

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


@dataclass(frozen=True)
class Query:
    name: str
    text: str  # the statement, as asyncpg receives it ($1, $2, ...)
    params: tuple[str, ...] = field(default=())

    @classmethod
    def define(cls, name: str, sql: str) -> Query:
        params: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match[1] not in params:
                params.append(match[1])
            return f"${params.index(match[1]) + 1}"

        return cls(name, _PARAM.sub(number, sql), tuple(params))

    def args(self, **values: Any) -> list[Any]:
        missing = set(self.params) - values.keys()
        extra = values.keys() - set(self.params)
        if missing or extra:
            raise TypeError(f"{self.name}: missing {sorted(missing)}, unexpected {sorted(extra)}")
        return [values[p] for p in self.params]


# The columns of a job as the API shows it. `max_attempts` NULL on the job means "the queue's setting",
# so it is resolved against the queue row `q` (absent only in the statement that creates the queue).
JOB = f"""
    j.id, j.queue, j.kind, j.key, j.status, j.payload, j.priority, j.run_at, j.attempts,
    coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts,
    j.dedup_key, j.last_error, j.lease_expires_at, j.created_at, j.updated_at, j.completed_at,
    j.result, j.progress, j.schedule, j.schedule_slot, j.worker_id, j.traceparent, j.tracestate
"""

# The columns of a job as a lease hands it out: the job, its lease, and no more (a lease of 1,000 jobs
# decodes every column of every row).
LEASED_JOB = f"""
    j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
    coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts,
    j.run_at, j.created_at, j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate
"""

# What the spans of a statement that ends attempts need of each job (app/telemetry/tracing.py): its trace
# context, and the attempt. Cheap when tracing is off: NULL, NULL and an integer.
TRACED = "j.traceparent, j.tracestate, j.attempts"
TRACED_OUT = "traceparent, tracestate, attempts"

# Finished jobs leave jobq.jobs: the statement that completes or cancels a job deletes it there and
# inserts it, finished, into jobq.jobs_history, where it stays until its `purge_after`, its queue's
# retention counted from then (a later change of the retention applies to jobs finished after it). So
# jobq.jobs holds only pending, running and dead jobs, and stays as small as the work in flight however
# many finished jobs are kept; jobs_history is written once per job and never updated, and retention
# drops its partitions a day at a time (app/service/history.py). Statements that look a job up by id, or
# list or count jobs of every status, read the view jobq.all_jobs, both tables in one snapshot.
JOB_COLUMNS = tuple(c.name for c in JobHistory.__table__.columns if c.name != "purge_after")


RETAINED = f"make_interval(secs => coalesce(r.retention, {DEFAULT_RETENTION}))"  # r: the job's queue


def _to_history(source: str, changes: dict[str, str], finished: str = "now()", where: str = "true") -> str:
    """An INSERT into jobq.jobs_history of the rows `m` of `source` (jobs taken out of jobq.jobs), with
    `changes` ({column: SQL}) applied, each kept until `finished` plus its queue's retention."""
    values = ", ".join(changes.get(c, f"m.{c}") for c in JOB_COLUMNS)
    return f"""
        INSERT INTO jobq.jobs_history AS j ({", ".join(JOB_COLUMNS)}, purge_after)
        SELECT {values}, {finished} + {RETAINED}
        FROM {source} m LEFT JOIN jobq.queues r ON r.name = m.queue
        WHERE {where}"""


# Jobs `taken` out of jobq.jobs, finished now: completed by ACK (with what its item sent as `acked_result`),
# cancelled by CANCEL. And finished jobs left in jobq.jobs as they are (MOVE_FINISHED), but those past
# their retention, which go.
_FINISHED_NOW = {"completed_at": "now()", "updated_at": "now()"}
_COMPLETED = _to_history(
    "taken",
    {"status": "'completed'", "lease_expires_at": "NULL", "result": "m.acked_result::jsonb", **_FINISHED_NOW},
)
_CANCELLED = _to_history("taken", {"status": "'cancelled'", **_FINISHED_NOW})
_MOVED = _to_history(
    "(SELECT j.* FROM jobq.jobs j JOIN doomed USING (id))",
    {},
    finished="m.completed_at",
    where=f"m.completed_at + {RETAINED} > now()",
)

# Wake-ups: every statement that makes jobs ready (or schedules them) sends one NOTIFY per queue it touched,
# not one per job: {"queue", "n": jobs made ready, "run_at": the earliest run_at, epoch seconds}. PostgreSQL
# delivers it at commit, to every replica's listener (app/service/wakeups.py), which wakes up to n waiting
# long-polls at once, or at run_at for jobs due later. A CTE only runs when the statement reads it, so
# each statement reads `notified` once (`WHERE (SELECT count(*) FROM notified) >= 0`).
CHANNEL = "jobq"


def _notify(source: str, where: str = "true") -> str:
    return f"""
    notified AS (
        SELECT pg_notify('{CHANNEL}', json_build_object(
                   'queue', queue, 'n', count(*), 'run_at', extract(epoch FROM min(run_at)))::text)
        FROM {source} WHERE {where} GROUP BY queue
    )"""


NOTIFIED = "(SELECT count(*) FROM notified) >= 0"

# A job with a key that stops running (or stops waiting for its retry) frees a slot of its key: the
# statements that end such jobs wake the queue's long-polls as if a job had become ready, since a job of
# that key may now go (flow control). Jobs without a key send nothing more.
KEY_FREED = "key IS NOT NULL"

# Waiting for a job (GET /jobs/{id}?wait=N): the waiter marks the job `awaited` (WATCH_JOB), and every
# statement that finishes a job (completed, dead, cancelled) sends one NOTIFY on DONE_CHANNEL per awaited
# job it finished, the job's id as payload: a column of its RETURNING, evaluated per row, that calls
# pg_notify only where the job is awaited. A statement finishing jobs nobody waits for sends nothing (and
# takes no part in PostgreSQL's notification queue). Delivered at commit to every replica's listener,
# which wakes that job's waiters (app/service/wakeups.py).
DONE_CHANNEL = "jobq_done"


def _notify_done(job: str = "j", finished: str = "true") -> str:
    """A RETURNING column: NOTIFY the job's waiters when it is awaited and `finished` holds."""
    return (
        f"CASE WHEN {job}.awaited AND {finished} THEN pg_notify('{DONE_CHANNEL}', {job}.id::text) END AS done"
    )


# Enqueues and SQS DeleteQueue serialise per queue, so that no job outlives its queue row (the lease,
# lease expiry and pruning all join it: such a job would never be seen again). Every statement that inserts
# jobs first takes a shared advisory lock on each queue it inserts into, held to the end of its
# transaction; shared locks do not block each other, so enqueues stay concurrent. DeleteQueue takes the
# same lock exclusively in a statement of its own before deleting (LOCK_QUEUE), so its delete's
# snapshot sees every enqueue that got in first, and an enqueue that comes later waits for it and then
# creates the queue row again. jobq.enqueue() takes it too (alembic 0003, with the same numbers).
# The two-key form keeps these locks apart from the one-key locks of migrations and maintenance; two
# queue names with the same hashtext merely serialise with each other's deletes.
QUEUE_LOCK_CLASS = 1785684593  # 'jobq' in ASCII


def _queue_locks(source: str) -> str:
    """A CTE `locked`: the distinct queues of `source` (a FROM item with a `queue` column), each once its
    shared lock is held. A statement reads it before inserting anything: its queue rows come from it,
    and its job insert is filtered by LOCKED, which PostgreSQL evaluates once, before the first row."""
    return f"""
    locked AS (
        SELECT queue, pg_advisory_xact_lock_shared({QUEUE_LOCK_CLASS}, hashtext(queue))
        FROM (SELECT DISTINCT queue FROM {source}) queues
    )"""


LOCKED = "(SELECT count(*) FROM locked) > 0"


def _queues_made(source: str) -> str:
    """The CTEs `locked` (_queue_locks) and `new_queues`: each queue of `source` locked, then made if it
    does not exist. A statement that puts jobs into queues reads them first and filters by LOCKED."""
    return f"""{_queue_locks(source)}, new_queues AS (
        INSERT INTO jobq.queues (name) SELECT queue FROM locked ON CONFLICT DO NOTHING
    )"""


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

# Idempotency keys (`Idempotency-Key` on POST /jobs and /jobs/batch; app/service/idempotency.py). A key's row
# holds what the database decided for each job of its answer, in request order, and is written in the
# statement (or transaction) that inserts the jobs: either both exist or neither. A key already there makes
# that statement fail on pk_idempotency_keys, inserting nothing; the service then reads the kept answer
# (ANSWERS). A second request with a key whose first is still in flight waits on the key's index entry until
# the first commits, then fails the same way: one insert, whatever the timing. The statements that keep
# answers under keys take them as :scope, :key and :request_hash (one call) or as arrays, one entry per call
# (calls sharing a statement, app/service/coalesce.py); those insert their keys in key order, so two
# statements waiting on each other's keys (retries overtaking their first tries) cannot deadlock.

# ENQUEUE_NEW for one call (POST /jobs/batch, or a single enqueue alone), keeping its answer, the row of
# arrays ENQUEUE_NEW returns, under its key: one more CTE, and no work per job.
ENQUEUE_NEW_ONCE = Query.define(
    "enqueue_new_once",
    f"""
    {_ENQUEUE_NEW_CTES}, answer AS ({_NEW_JOBS_ROW}
    ), kept AS (
        INSERT INTO jobq.idempotency_keys
            (scope, key, request_hash, ids, run_ats, max_attempts, created_at, expires_at)
        SELECT :scope, :key, :request_hash, ids, run_ats, max_attempts, created_at,
               created_at + make_interval(secs => :ttl)
        FROM answer
    )
    SELECT * FROM answer WHERE {NOTIFIED}
    """,
)

# ENQUEUE_NEW for concurrent single enqueues sharing the statement (app/service/coalesce.py), each call one
# job with its own key: the n-th job in request order (its id the n-th smallest, see ENQUEUE_NEW) is kept
# under the n-th key.
ENQUEUE_NEW_EACH_ONCE = Query.define(
    "enqueue_new_each_once",
    f"""
    {_ENQUEUE_NEW_CTES}, answered AS (
        SELECT j.id, nullif(j.run_at, j.created_at) AS run_at,
               coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts,
               j.created_at, row_number() OVER (ORDER BY j.id) AS ord
        FROM j LEFT JOIN jobq.queues q ON q.name = j.queue
    ), kept AS (
        INSERT INTO jobq.idempotency_keys
            (scope, key, request_hash, ids, run_ats, max_attempts, created_at, expires_at)
        SELECT k.scope, k.key, k.request_hash, ARRAY[a.id], ARRAY[a.run_at], ARRAY[a.max_attempts],
               a.created_at, a.created_at + make_interval(secs => :ttl)
        FROM answered a
        JOIN unnest(:scopes::text[], :keys::text[], :request_hashes::bytea[])
             WITH ORDINALITY AS k(scope, key, request_hash, ord) ON k.ord = a.ord
        ORDER BY k.scope, k.key
    )
    SELECT array_agg(id ORDER BY id) AS ids, array_agg(run_at ORDER BY id) AS run_ats,
           array_agg(max_attempts ORDER BY id) AS max_attempts, min(created_at) AS created_at
    FROM answered
    WHERE {NOTIFIED}
    """,
)

# Keep the answers of calls that went through ENQUEUE (some dedup_key), in the transaction that inserted
# their jobs, so now() is their created_at. One row per job: its call (:calls, 1-based), id, run_at
# (NULL: created_at) and max_attempts, or, for a duplicate, its whole answer as JSON text in :holders.
KEEP_ANSWERS = Query.define(
    "keep_answers",
    """
    WITH keys AS (
        SELECT * FROM unnest(:scopes::text[], :keys::text[], :request_hashes::bytea[])
                      WITH ORDINALITY AS k(scope, key, request_hash, call)
    )
    INSERT INTO jobq.idempotency_keys
        (scope, key, request_hash, ids, run_ats, max_attempts, holders, created_at, expires_at)
    SELECT keys.scope, keys.key, keys.request_hash, array_agg(a.id ORDER BY a.ord),
           array_agg(a.run_at ORDER BY a.ord), array_agg(a.max_attempts ORDER BY a.ord),
           CASE WHEN bool_or(a.holder IS NOT NULL) THEN array_agg(a.holder ORDER BY a.ord) END,
           now(), now() + make_interval(secs => :ttl)
    FROM unnest(:calls::int[], :ids::bigint[], :run_ats::timestamptz[], :max_attempts::int[],
                :holders::text[]) WITH ORDINALITY AS a(call, id, run_at, max_attempts, holder, ord)
    JOIN keys ON keys.call = a.call
    GROUP BY keys.call, keys.scope, keys.key, keys.request_hash
    ORDER BY keys.scope, keys.key
    """,
)

# The kept answers of these keys. A key past its expires_at that pruning has not reached yet is deleted
# here instead of answered: from expires_at on, the key is free for a new request.
ANSWERS = Query.define(
    "answers",
    """
    WITH wanted AS (
        SELECT * FROM unnest(:scopes::text[], :keys::text[]) AS w(scope, key)
    ), expired AS (
        DELETE FROM jobq.idempotency_keys k USING wanted w
        WHERE k.scope = w.scope AND k.key = w.key AND k.expires_at <= now()
    )
    SELECT k.scope, k.key, k.request_hash, k.ids, k.run_ats, k.max_attempts, k.holders, k.created_at
    FROM jobq.idempotency_keys k JOIN wanted w ON k.scope = w.scope AND k.key = w.key
    WHERE k.expires_at > now()
    """,
)


# Scopes: a token or SQS key may be limited to some queues (app/core/access.py). Statements that find jobs by
# id, or list queues or dead jobs, take its patterns as :scope, as LIKE patterns (`celery-%`, with `_`
# escaped), or NULL for every queue. A job outside them is not found, in the same statement: no extra
# round trip, and the same answer as a job that does not exist.
def _in_scope(column: str) -> str:
    return f"(:scope::text[] IS NULL OR {column} LIKE ANY(:scope::text[]))"


GET_JOB = Query.define(
    "get_job",
    f"""
    SELECT {JOB} FROM jobq.all_jobs j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE j.id = :id AND {_in_scope("j.queue")}
    """,
)


# Cancel jobs that have not started (CANCEL: one, CANCEL_JOBS: the dashboard's selection), moving them
# to jobq.jobs_history. Running, finished and dead jobs are left alone.
def _cancel(which: str) -> str:
    return f"""
    WITH taken AS (
        DELETE FROM jobq.jobs j USING jobq.queues q
        WHERE {which} AND j.status = 'pending' AND q.name = j.queue AND {_in_scope("j.queue")}
        RETURNING j.*
    ), j AS ({_CANCELLED}
        RETURNING j.*, {_notify_done()}
    ), cancelled AS (
        SELECT {JOB}, j.done FROM j LEFT JOIN jobq.queues q ON q.name = j.queue
    ), {_notify("cancelled", f"{KEY_FREED} AND attempts > 0")}
    SELECT * FROM cancelled WHERE {NOTIFIED}
    """


CANCEL = Query.define("cancel", _cancel("j.id = :id"))
CANCEL_JOBS = Query.define("cancel_jobs", _cancel("j.id = ANY(:ids::bigint[])"))

# Run a job that waits for its run_at (scheduled, or waiting for a retry's backoff) now: ready at once,
# and the queue's long-polls woken as for a new job. A job already due is left as it is (a new run_at
# would only move it back in line).
RUN_NOW = Query.define(
    "run_now",
    f"""
    WITH ran AS (
        UPDATE jobq.jobs j SET run_at = now(), updated_at = now()
        FROM jobq.queues q
        WHERE j.id = :id AND j.status = 'pending' AND j.run_at > now() AND q.name = j.queue
          AND {_in_scope("j.queue")}
        RETURNING {JOB}
    ), {_notify("ran")}
    SELECT * FROM ran WHERE {NOTIFIED}
    """,
)

# A waiter's mark on a job not finished yet (see DONE_CHANNEL); no row back: the job is finished, gone or
# out of scope, and GET_JOB tells which. A statement of its own, before the waiter reads the job: once
# it commits, whatever finishes the job sees the mark (a finish under way waits for the row and then
# reads it), so the waiter, registered before it, cannot miss the notification.
# The mark locks the row for a moment, and a LEASE meanwhile passes a pending job over (SKIP LOCKED): a
# long-poll woken for that very job (a producer that enqueues, then waits at once) would find nothing
# and wait on. So marking a pending job notifies its queue again, as if it had just become ready.
WATCH_JOB = Query.define(
    "watch_job",
    f"""
    WITH watched AS (
        UPDATE jobq.jobs SET awaited = true
        WHERE id = :id AND status IN ('pending', 'running') AND {_in_scope("queue")}
        RETURNING id, queue, status, run_at
    ), {_notify("watched", "status = 'pending'")}
    SELECT id FROM watched WHERE {NOTIFIED}
    """,
)

# WATCH_JOB for several waiters at once (app/service/producers.py), without waiting for any row: one whose
# row another statement holds (an ack, a claim) is passed over and marked by WATCH_JOB alone, so this
# statement never holds some rows while it waits for others (no deadlock with a batch ack), and a flood
# of waiters costs a few statements, and one NOTIFY per queue each, rather than one of each per waiter.
WATCH_JOBS = Query.define(
    "watch_jobs",
    f"""
    WITH free AS (
        SELECT id FROM jobq.jobs
        WHERE id = ANY(:ids::bigint[]) AND status IN ('pending', 'running') AND {_in_scope("queue")}
        FOR NO KEY UPDATE SKIP LOCKED
    ), watched AS (
        UPDATE jobq.jobs j SET awaited = true FROM free WHERE j.id = free.id
        RETURNING j.id, j.queue, j.status, j.run_at
    ), {_notify("watched", "status = 'pending'")}
    SELECT id FROM watched WHERE {NOTIFIED}
    """,
)

# Claim ready jobs in one statement, so nothing can run between choosing and marking; one statement serves
# several lease calls on the same queue at once (app/service/coalesce.py). Each call owns a run of slots:
# :visibility_timeouts and :worker_ids hold one entry per slot, and the n-th job in lease order fills slot n,
# so each call gets its share in order and its own lease settings.
# - `q`: the queue's settings, and no row at all when it is paused (or unknown), or under flow control
#   (claimed by LEASE_FLOW instead): then nothing is claimed.
# - `ready`: walks ix_jobs_claim in lease order; SKIP LOCKED passes over rows another claim holds instead of
#   waiting for it, so concurrent statements get different jobs and never block each other. Order is
#   therefore best effort under concurrency.
# - the UPDATE marks them running, counts the attempt and fences each lease with a fresh token and a
#   deadline on the database clock. It reads each slot's settings by subscript, never by joining the
#   arrays as rows: with statistics from a nearly empty table the planner took such a join for one row
#   and rescanned it per job (quadratic: 18 ms instead of 2 for a claim of 216 jobs).
# - the jobs found by the scan of their queue are looked up again by id alone, through the primary key:
#   a unique index on id is what keeps those lookups one row each, whatever the statistics say. On
#   statistics taken while the table was nearly empty (a burst into a new queue, before autovacuum's
#   next ANALYZE), naming the queue there too let the planner walk the queue's claim index per job
#   instead (LEASE_FLOW: 12 ms against 2.7 for 100 jobs); with the primary key on (queue, id) and only a
#   plain index on id, it hashed the whole table even without the queue named (LEASE_FLOW: 480 ms; the
#   plain LEASE with it named: 250 ms against 1.3). So jobs keeps its key on id on one server, and
#   uq_jobs_queue_id is the key a table distributed by queue would have (README: Scaling out).
LEASE = Query.define(
    "lease",
    f"""
    WITH q AS (
        SELECT max_attempts, visibility_timeout FROM jobq.queues
        WHERE name = :queue AND NOT paused AND NOT flow
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY priority, run_at, id) AS slot
        FROM (
            SELECT id, priority, run_at FROM jobq.jobs
            WHERE queue = :queue AND status = 'pending' AND run_at <= now() AND EXISTS (SELECT FROM q)
            ORDER BY priority, run_at, id
            LIMIT cardinality(:worker_ids::text[])
            FOR UPDATE SKIP LOCKED
        ) locked
    )
    UPDATE jobq.jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(
            secs => coalesce((:visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
        worker_id = (:worker_ids::text[])[ready.slot], updated_at = now()
    FROM ready, q
    WHERE j.id = ready.id
    RETURNING {LEASED_JOB}, ready.slot
    """,
)

# --- flow control (app/service/flow.py) ----------------------------------------------------------------
# A queue with flow control (`queues.flow`: key_concurrency, fair, rate, key_rate, or a key's override)
# is claimed in one short transaction of two statements instead of LEASE: LEASE_FLOW_FRONT (the same two
# steps in one function) for a queue under key concurrency alone, while the front of the queue has room
# (below); otherwise FLOW_KEYS then LEASE_FLOW:
# - FLOW_KEYS walks the keys that have pending jobs, one after the other from where this replica's last
#   claim stopped (round robin; a `fair` queue's claims from the key after the one the queue's last claim
#   served, on any replica), and takes a transaction-scoped advisory lock on each key it will claim
#   from (try-lock: a key another claim holds is passed over, as SKIP LOCKED passes over rows). A queue
#   with a rate locks its row too, so claims of it take turns.
# - LEASE_FLOW runs after the locks are held, so its snapshot (a statement's own, in READ COMMITTED)
#   sees every claim, ack and expiry that committed under them: the running jobs it counts per key are
#   the true count, and no other claim can add to it before this one commits. Nothing is kept per key
#   but what the jobs table says (a slot is a running job), so whatever ends a lease (ack, nack, expiry,
#   release, a late ack of an expired lease) frees its slot exactly once, by changing the job's status.
#   Rate windows are the exception: they are kept (keys.rate_times, queues.rate_times) and written by
#   the claim that holds the lock.
# Jobs without a key are not limited by key; they are taken from the front of the queue.

# A key's advisory lock: one bigint from the queue and the key.
_KEY_LOCK = "pg_try_advisory_xact_lock(hashtextextended({key}, hashtext(:queue)))"


def _keys_with_pending(after: str) -> str:
    """The first key of the queue's pending jobs after `after` (NULL: none), through ix_jobs_key_ready.
    ORDER BY ... LIMIT 1 rather than min(): on statistics that take the table for nearly empty, min()
    was planned as an aggregate over every later key's jobs."""
    return f"""(SELECT key FROM jobq.jobs
                WHERE queue = :queue AND status = 'pending' AND key IS NOT NULL AND key > {after}
                ORDER BY key LIMIT 1)"""


# The sum of a rate window's counts within its last `period` seconds.
# Rate windows run on statement_timestamp(), the claim statement's own start, not now() (its
# transaction's): a claim runs after it holds its key's (or queue's) lock, so the claims of one window take
# their times in the order they held it. By now() a claim that began before another but got the lock after
# it would read a window the other had already pruned past its own start, and could lease one too many.
WINDOW_CLOCK = "statement_timestamp()"


def _used(times: str, counts: str, period: str) -> str:
    return f"""(SELECT coalesce(sum(c), 0) FROM unnest({times}, {counts}) AS w(t, c)
               WHERE t > {WINDOW_CLOCK} - make_interval(secs => {period}))"""


# A rate window (`rate_times`, `rate_counts` and `rate_period` of the row `source`) without the claims
# that have left it, to which a claim then adds its own: `times`, `counts`.
def _window(source: str) -> str:
    return f"""(
            SELECT coalesce(array_agg(t ORDER BY t), '{{}}') AS times,
                   coalesce(array_agg(c ORDER BY t), '{{}}') AS counts
            FROM unnest({source}.rate_times, {source}.rate_counts) AS w(t, c)
            WHERE t > {WINDOW_CLOCK} - make_interval(secs => {source}.rate_period)
        )"""


# Running jobs of a key (ix_jobs_key_held).
def _running(key: str) -> str:
    return f"""(SELECT count(*) FROM jobq.jobs h
               WHERE h.queue = :queue AND h.key = {key} AND h.status = 'running')"""


# The walk's next key after `key`, locked: the next key with pending jobs, or once past the last (and
# not `wrapped` yet), the first; none once it would pass `after` again, where the walk began. A row of
# (key, wrapped, locked), or none when the walk is done.
def _next_key(key: str, wrapped: str, after: str) -> str:
    # OFFSET 0 keeps each subquery whole, so the lock runs once for its key and not again per reference.
    return f"""(
            SELECT key, wrapped, {_KEY_LOCK.format(key="key")} AS locked FROM (
                SELECT coalesce(later, CASE WHEN NOT {wrapped} THEN {_keys_with_pending("''")} END) AS key,
                       {wrapped} OR later IS NULL AS wrapped
                FROM (SELECT {_keys_with_pending(key)} AS later OFFSET 0) l
                OFFSET 0
            ) c
            WHERE key IS NOT NULL AND NOT (wrapped AND key > {after})
            OFFSET 0
        )"""


# Walk the keys with pending jobs after :after, in key order, on from the first key once past the last
# and up to :after again, locking each, until :scan are locked or :reach looked at: a row per key looked
# at, `locked` false for one another claim holds (passed over, as SKIP LOCKED passes over a row, and the
# walk goes on past it: two claims starting from one place take consecutive stretches of keys instead of
# the second finding the first's keys held). The lock is taken in the recursive step itself, once per key,
# so the walk stops as soon as it has enough. :after NULL is the queue's own `fair_last_key`, the key its
# last claim served last (a `fair` queue's turn, kept for every replica); otherwise the caller keeps the
# last key as its next :after. A queue with a rate also locks its row first, so that its claims take turns.
# (Passing over full keys here, by a running count read before the lock, cost more than LEASE_FLOW
# finding them full.)
def _flow_keys(rated: bool) -> str:
    rate_turn = """rate_turn AS (
        SELECT name FROM jobq.queues WHERE name = :queue AND rate_limit IS NOT NULL FOR NO KEY UPDATE
    ), """
    return f"""
    WITH RECURSIVE {rate_turn if rated else ""}start AS (
        SELECT coalesce(:after::text, (SELECT fair_last_key FROM jobq.queues WHERE name = :queue), '')
            AS after
        WHERE EXISTS (SELECT FROM jobq.queues WHERE name = :queue AND NOT paused AND flow)
          {"AND (SELECT count(*) FROM rate_turn) >= 0" if rated else ""}
    ), walk(key, wrapped, after, locked, got, n) AS (
        SELECT k.key, k.wrapped, s.after, k.locked, k.locked::int, 1
        FROM start s, LATERAL {_next_key("s.after", "false", "s.after")} k
        UNION ALL
        SELECT k.key, k.wrapped, w.after, k.locked, w.got + k.locked::int, w.n + 1
        FROM walk w, LATERAL {_next_key("w.key", "w.wrapped", "w.after")} k
        WHERE w.got < :scan AND w.n < :reach
    )
    SELECT key, locked FROM walk
    """


FLOW_KEYS = Query.define("flow_keys", _flow_keys(rated=False))
FLOW_KEYS_RATED = Query.define("flow_keys_rated", _flow_keys(rated=True))


# Claim up to one job per slot (as LEASE) from the keys FLOW_KEYS locked (:keys, in the order walked)
# and from the jobs without a key, within every limit:
# - `room`: per key, its concurrency (or its override) less its running jobs, and within its rate
#   window; a key whose jobs run in order (concurrency 1) with a job waiting for its retry gets that job
#   when it is due, and nothing else: the retry holds the key, as an SQS FIFO message group is held;
# - `candidates`: each key's first ready jobs, as many as its room; jobs without a key from the front of
#   the queue (the first :lookahead ready jobs);
# - `chosen`: in lease order (priority, run_at, id), or with `fair` round by round: every key's first job
#   (in turn: from the key after the queue's `fair_last_key`, as this statement reads it, on to the last
#   key, then from the first), then every key's second, ...; as many as the slots, or as the queue's rate
#   window has room for; each locked (SKIP LOCKED: a job another statement holds is passed over, which
#   for a key in order means nothing of it this time).
# Then the chosen jobs are leased as LEASE leases them, each slot's settings read from the arrays by its
# number (no join whose plan could go quadratic). With `fair`, the key of the last slot leased becomes
# the queue's `fair_last_key` (`turned`), where the next claim's turn begins, on any replica. The turn is
# read here again, not only by FLOW_KEYS: this statement begins once the keys' locks are held, so it
# sees the turn of every claim that held them before. It is written unless another claim is writing it
# at that moment (SKIP LOCKED: a claim never waits for the queue's row, and never for a statement that
# holds the row and waits for a job this claim holds); that claim's turn stands, which served keys
# beside this one's. A queue with a rate writes it with its window (its claims hold the row already).
# Always one row at least: `wake_in`, the seconds
# until a rate window next lets a job go when one held some back (NULL otherwise); `id` NULL when nothing
# was leased.
# Two variants, since a claim's planning cost as much as its work: LEASE_FLOW for queues without rates
# (it claims nothing from a queue with a rate, and nothing of a key with a rate of its own), and
# LEASE_FLOW_RATED, which keeps the rate windows of the queue and of each key: the claim's leases added
# to them in the same statement.
def _lease_flow(rated: bool) -> str:
    if rated:
        wanted = f"""greatest(least(cardinality(:worker_ids::text[]),
                              q.rate_limit - {_used("q.rate_times", "q.rate_counts", "q.rate_period")}), 0)"""
        key_room = f"k.rate_limit - {_used('k.rate_times', 'k.rate_counts', 'k.rate_period')}"
        unrated = ""
    else:
        wanted, key_room = "cardinality(:worker_ids::text[])", "NULL"
        unrated = "AND rate_limit IS NULL AND key_rate_limit IS NULL"
    windows = f"""
    , per_key AS (
        SELECT key, count(*)::int AS n FROM leased WHERE key IS NOT NULL GROUP BY key
    ), key_windows AS (
        INSERT INTO jobq.keys AS o (queue, key, rate_times, rate_counts)
        SELECT :queue, k.key, w.times || {WINDOW_CLOCK}, w.counts || p.n
        FROM per_key p JOIN k USING (key), LATERAL {_window("k")} w
        WHERE k.rate_limit IS NOT NULL
        ON CONFLICT (queue, key) DO UPDATE SET rate_times = excluded.rate_times,
                                               rate_counts = excluded.rate_counts
    ), queue_window AS (
        UPDATE jobq.queues qs SET rate_times = w.times || {WINDOW_CLOCK}, rate_counts = w.counts || l.n,
            fair_last_key = CASE WHEN q.fair THEN coalesce((SELECT key FROM served), qs.fair_last_key)
                                 ELSE qs.fair_last_key END
        FROM (SELECT count(*)::int AS n FROM leased) l, q, LATERAL {_window("q")} w
        WHERE qs.name = :queue AND q.rate_limit IS NOT NULL AND l.n > 0
    ), wake AS (
        SELECT extract(epoch FROM min(expires) - {WINDOW_CLOCK})::float8 AS wake_in FROM (
            SELECT min(t) + make_interval(secs => q.rate_period) AS expires
            FROM q, unnest(q.rate_times, q.rate_counts) AS w(t, c)
            WHERE q.rate_limit IS NOT NULL AND t > {WINDOW_CLOCK} - make_interval(secs => q.rate_period)
              AND (SELECT n FROM wanted) = 0
            GROUP BY q.rate_period
            UNION ALL
            SELECT min(t) + make_interval(secs => r.rate_period)
            FROM (SELECT * FROM room WHERE rate_limit IS NOT NULL) r,
                 unnest(r.rate_times, r.rate_counts) AS w(t, c)
            WHERE t > {WINDOW_CLOCK} - make_interval(secs => r.rate_period)
              AND r.rate_limit - {_used("r.rate_times", "r.rate_counts", "r.rate_period")} <= 0
            GROUP BY r.key, r.rate_period
        ) held_back
    )"""
    return f"""
    WITH q AS (
        SELECT max_attempts, visibility_timeout, key_concurrency, fair, rate_limit, rate_period,
               key_rate_limit, key_rate_period, rate_times, rate_counts, fair_last_key
        FROM jobq.queues WHERE name = :queue AND NOT paused AND flow {unrated}
    ), wanted AS (
        SELECT {wanted} AS n FROM q
    ), k AS (
        SELECT u.key,
               CASE WHEN q.fair THEN row_number() OVER (
                   ORDER BY u.key <= coalesce(q.fair_last_key, ''), u.key) ELSE u.turn END AS turn,
               coalesce(o.concurrency, q.key_concurrency) AS concurrency,
               coalesce(o.rate_limit, q.key_rate_limit) AS rate_limit,
               coalesce(o.rate_period, q.key_rate_period) AS rate_period, o.rate_times, o.rate_counts
        FROM q CROSS JOIN unnest(:keys::text[]) WITH ORDINALITY AS u(key, turn)
        LEFT JOIN jobq.keys o ON o.queue = :queue AND o.key = u.key
        {"" if rated else "WHERE o.rate_limit IS NULL"}
    ), room AS (
        SELECT k.*, least(wanted.n, k.concurrency - {_running("k.key")}, {key_room}) AS room,
               CASE WHEN k.concurrency = 1 THEN (
                   SELECT id FROM jobq.jobs h
                   WHERE h.queue = :queue AND h.key = k.key AND h.status = 'pending' AND h.attempts > 0
                   ORDER BY priority, run_at, id LIMIT 1) END AS retry
        FROM k CROSS JOIN wanted
    ), candidates AS (
        SELECT j.id, j.priority, j.run_at, r.turn, 1::bigint AS round
        FROM room r JOIN jobq.jobs j ON j.id = r.retry
        WHERE r.room > 0 AND j.run_at <= now()
        UNION ALL
        SELECT c.id, c.priority, c.run_at, r.turn, c.round
        FROM room r, LATERAL (
            SELECT id, priority, run_at, row_number() OVER (ORDER BY priority, run_at, id) AS round
            FROM (SELECT id, priority, run_at FROM jobq.jobs
                  WHERE queue = :queue AND key = r.key AND status = 'pending' AND run_at <= now()
                  ORDER BY priority, run_at, id
                  LIMIT r.room) first_ready
        ) c
        WHERE r.room > 0 AND r.retry IS NULL
        UNION ALL
        SELECT id, priority, run_at, 0, row_number() OVER (ORDER BY priority, run_at, id)
        FROM (SELECT id, key, priority, run_at FROM jobq.jobs
              WHERE queue = :queue AND status = 'pending' AND run_at <= now() AND EXISTS (SELECT FROM q)
              ORDER BY priority, run_at, id
              LIMIT :lookahead) front
        WHERE key IS NULL
    ), chosen AS (
        SELECT c.id, row_number() OVER (
                   ORDER BY CASE WHEN q.fair THEN c.round END, CASE WHEN q.fair THEN c.turn END,
                            c.priority, c.run_at, c.id) AS ord
        FROM candidates c CROSS JOIN q
        ORDER BY ord
        LIMIT coalesce((SELECT n FROM wanted), 0)
    ), locked AS (
        SELECT c.id, c.ord FROM chosen c JOIN jobq.jobs j ON j.id = c.id
        WHERE j.status = 'pending'
        FOR UPDATE OF j SKIP LOCKED
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY ord) AS slot FROM locked
    ), leased AS (
        UPDATE jobq.jobs j
        SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(
                secs => coalesce((:visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
            worker_id = (:worker_ids::text[])[ready.slot], updated_at = now()
        FROM ready, q
        WHERE j.id = ready.id
        RETURNING {LEASED_JOB}, ready.slot
    ), served AS (
        SELECT key FROM leased WHERE key IS NOT NULL ORDER BY slot DESC LIMIT 1
    ), turned AS (
        UPDATE jobq.queues qs SET fair_last_key = served.key
        FROM served
        WHERE qs.name = (SELECT name FROM jobq.queues
                         WHERE name = :queue AND (SELECT fair AND rate_limit IS NULL FROM q)
                           AND EXISTS (SELECT FROM served)
                         FOR NO KEY UPDATE SKIP LOCKED)
    ){windows if rated else ", wake AS (SELECT NULL::float8 AS wake_in)"}
    SELECT leased.*, wake.wake_in FROM wake LEFT JOIN leased ON true
    """


LEASE_FLOW = Query.define("lease_flow", _lease_flow(rated=False))
LEASE_FLOW_RATED = Query.define("lease_flow_rated", _lease_flow(rated=True))

# A queue under key concurrency alone (no `fair`, no rate) is first claimed from its front, as LEASE
# claims. Walking the keys reads each key's jobs through its own index descents and takes jobs scattered
# over the table (a key's next jobs lie far apart); the front is one scan of the claim index over jobs that
# lie together, so while the front of the queue has room (its keys not full) a claim costs little more
# than LEASE (statement bench, 100 jobs over 1,000 keys: 2.9 ms against 2.1 for LEASE and 3.9 for the
# walk). A claim that finds the front held (full keys, keys another claim holds) walks the keys for the
# slots left (app/service/flow.py).
# The claim is jobq.lease_flow_front() (alembic 0021, where its two statements are, FRONT and LEASE): the
# first locks the first :lookahead ready jobs in lease order and tries their keys' locks, the second,
# whose snapshot begins once the locks are held (as LEASE_FLOW's), leases those within their key's room.
# One call in one round trip, where the two statements in a transaction of their own took four: the
# keyed drain went from 24,662 to 27,100 jobs/s. Rows as LEASE's, each with its slot, and on every row
# (on one row of NULL jobs when nothing was leased) how many jobs it `looked` at, and how many it
# `passed` over because another claim held their key.
LEASE_FLOW_FRONT = Query.define(
    "lease_flow_front",
    "SELECT * FROM jobq.lease_flow_front(:queue, :lookahead, :visibility_timeouts, :worker_ids)",
)

# Complete jobs whose latest lease token the caller holds, moving them to jobq.jobs_history. Accepted
# after the lease expired (lease expiry moved the job to pending or dead but kept the token), because the
# work was done; refused once anyone leased the job again (new token) or nack or dead retry cleared the
# token. Each item names its job by queue and id (the queue its lease token carries: app/service/rows.py),
# as do NACK, RELEASE and EXTEND.
# Each row back names the (id, token) that completed it: one statement may carry several items for one
# job (a batch, or acks of two workers coalesced), and only the item holding that token was done by it.
# :results holds each item's result as JSON text (NULL: none), or is NULL itself when no item has one,
# as most acks do: unnest pads it with NULLs, so an ack without results sends and parses nothing more.
# A repeated ack finds the job completed (in jobs_history) and changes nothing, its result included.
ACK = Query.define(
    "ack",
    f"""
    WITH taken AS (
        DELETE FROM jobq.jobs j
        USING unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[], :results::text[])
              AS a(id, queue, lease_token, result)
        WHERE j.id = a.id AND j.queue = a.queue AND j.lease_token = a.lease_token
          AND j.status IN ('running', 'pending', 'dead')
        RETURNING j.*, a.result AS acked_result
    ), acked AS ({_COMPLETED}
        RETURNING j.id, j.lease_token, j.queue, j.key, j.run_at, {_notify_done()}, {TRACED}
    ), {_notify("acked", KEY_FREED)}
    SELECT id, lease_token, queue, done, {TRACED_OUT} FROM acked WHERE {NOTIFIED}
    """,
)

# The queue of each job (lease tokens issued before they named their queue: app/service/rows.py).
JOB_QUEUES = Query.define("job_queues", "SELECT id, queue FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])")

# Where an ack, nack or extend changed nothing: is the job unknown (404), already completed under this
# very token (a repeated ack, answered as success), or leased by someone else (409 lease_lost)?
LEASE_STATUS = Query.define(
    "lease_status",
    "SELECT id, status, lease_token FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])",
)

# Give jobs back after a failed attempt. Only the current holder of a running lease may.
# - dead=true, or no attempts left: the job goes dead and keeps its run_at.
# - otherwise pending again at now + retry_after, or the queue's backoff: base * 2^(attempts-1) with
#   0-30 % jitter against thundering herds, never more than the cap (the exponent is bounded so the
#   arithmetic cannot overflow).
# The token is cleared: this lease is over, and a late ack by the same worker must not complete a retry.
# As with ACK, each row back names the (id, token) that ended the lease (n.lease_token: the job's own is
# cleared by then), so only that item is answered as done.
NACK = Query.define(
    "nack",
    f"""
    WITH n AS (
        SELECT n.*, (n.dead OR j.attempts >= coalesce(j.max_attempts, q.max_attempts)) AS to_dead,
               least(q.backoff_cap,
                     q.backoff_base * power(2, least(j.attempts - 1, 60)) * (1 + 0.3 * random())) AS backoff
        FROM unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[], :errors::text[],
                    :retry_afters::float8[], :deads::bool[])
             AS n(id, queue, lease_token, error, retry_after, dead)
        JOIN jobq.jobs j ON j.id = n.id AND j.queue = n.queue
        JOIN jobq.queues q ON q.name = j.queue
    ), nacked AS (
        UPDATE jobq.jobs j
        SET status = CASE WHEN n.to_dead THEN 'dead' ELSE 'pending' END,
            run_at = CASE WHEN n.to_dead THEN j.run_at
                          ELSE now() + make_interval(secs => coalesce(n.retry_after, n.backoff)) END,
            last_error = n.error, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
        FROM n
        WHERE j.id = n.id AND j.queue = n.queue AND j.lease_token = n.lease_token AND j.status = 'running'
        RETURNING j.id, n.lease_token, j.queue, j.key, j.status, j.run_at,
                  {_notify_done(finished="n.to_dead")}, {TRACED}
    ), {_notify("nacked", f"status = 'pending' OR {KEY_FREED}")}
    SELECT id, lease_token, queue, status, run_at, {TRACED_OUT} FROM nacked WHERE {NOTIFIED}
    """,
)

# Hand back jobs claimed for a long-poll whose client went away before they could be delivered: pending
# again at their place in line, and the attempt not counted (the job never reached a worker). Each row
# back names the (id, token) that released it, as with ACK.
RELEASE = Query.define(
    "release",
    f"""
    WITH released AS (
        UPDATE jobq.jobs j
        SET status = 'pending', attempts = j.attempts - 1, lease_token = NULL, lease_expires_at = NULL,
            worker_id = NULL, updated_at = now()
        FROM unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[]) AS r(id, queue, lease_token)
        WHERE j.id = r.id AND j.queue = r.queue AND j.lease_token = r.lease_token AND j.status = 'running'
        RETURNING j.id, r.lease_token, j.queue, j.run_at
    ), {_notify("released")}
    SELECT id, lease_token FROM released WHERE {NOTIFIED}
    """,
)

# Move a running lease's deadline to now + :visibility_timeout; only its holder may. With :progress (JSON
# text) it replaces the job's progress; NULL keeps the last one.
EXTEND = Query.define(
    "extend",
    """
    UPDATE jobq.jobs
    SET lease_expires_at = now() + make_interval(secs => :visibility_timeout), updated_at = now(),
        progress = coalesce(:progress::jsonb, progress)
    WHERE id = :id AND queue = :queue AND lease_token = :lease_token AND status = 'running'
    RETURNING id, lease_expires_at
    """,
)

# SQS ChangeMessageVisibility by the last receive of a message whose visibility ran out, nobody having
# received it since: in flight again under the same receipt handle, as SQS allows (jobq's own EXTEND does
# not). The expiry counted that receive's attempt already; this counts none. Jobs with a key stay pending:
# running again outside the claim could pass their key's limits.
REVIVE_LEASE = Query.define(
    "revive_lease",
    """
    UPDATE jobq.jobs
    SET status = 'running', lease_expires_at = now() + make_interval(secs => :visibility_timeout),
        updated_at = now()
    WHERE id = :id AND queue = :queue AND lease_token = :lease_token AND status = 'pending' AND key IS NULL
    RETURNING id, lease_expires_at
    """,
)

# Lease expiry: running jobs past their deadline count a failed attempt and become leasable again at once
# (pending, keeping their place in line), or dead when out of attempts. SKIP LOCKED and the status check
# make it safe in every replica at once; the token stays so the late holder may still ack.
EXPIRE_LEASES = Query.define(
    "expire_leases",
    f"""
    WITH expired AS (
        SELECT id FROM jobq.jobs
        WHERE status = 'running' AND lease_expires_at <= now()
        ORDER BY lease_expires_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ), returned AS (
        UPDATE jobq.jobs j
        SET status = CASE WHEN j.attempts >= coalesce(j.max_attempts, q.max_attempts)
                          THEN 'dead' ELSE 'pending' END,
            last_error = format('lease expired at %s on attempt %s (worker %s)',
                                to_char(j.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                                j.attempts, coalesce(j.worker_id, 'unnamed')),
            lease_expires_at = NULL, updated_at = now()
        FROM expired, jobq.queues q
        WHERE j.id = expired.id AND q.name = j.queue
        RETURNING j.id, j.queue, j.key, j.status, j.run_at, {_notify_done(finished="j.status = 'dead'")},
                  {TRACED}
    ), {_notify("returned", f"status = 'pending' OR {KEY_FREED}")}
    SELECT id, queue, status, {TRACED_OUT} FROM returned WHERE {NOTIFIED}
    """,
)

# Finished jobs still in jobq.jobs (finished before jobs_history existed, or by a replica of an older
# release during a rolling upgrade) moved to jobs_history, kept until their completed_at plus their
# queue's retention; those past it already are only deleted. A bounded batch per statement, so no move
# holds many locks or a long transaction; the caller loops while batches come back full.
MOVE_FINISHED = Query.define(
    "move_finished",
    f"""
    WITH doomed AS (
        SELECT id FROM jobq.jobs
        WHERE status IN ('completed', 'cancelled')
        ORDER BY completed_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ), kept AS ({_MOVED}
    )
    DELETE FROM jobq.jobs j USING doomed WHERE j.id = doomed.id
    """,
)

# Retention in the default partition of jobs_history, which holds the finished jobs no day's partition
# took (app/service/history.py): the rows past their purge_after deleted, a bounded batch per statement.
PRUNE_HISTORY_DEFAULT = Query.define(
    "prune_history_default",
    """
    WITH doomed AS (
        SELECT id, purge_after FROM jobq.jobs_history_default
        WHERE purge_after <= now()
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobq.jobs_history_default h USING doomed
    WHERE h.id = doomed.id AND h.purge_after = doomed.purge_after
    """,
)

# The day partitions of jobs_history (named jobs_history_pYYYYMMDD, each holding the jobs whose
# purge_after falls on that day, UTC).
HISTORY_PARTITIONS = Query.define(
    "history_partitions",
    """
    SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'jobq.jobs_history'::regclass AND c.relname ~ '^jobs_history_p[0-9]{8}$'
    """,
)

# The days (UTC) whose partitions jobs_history needs now: for each retention in use (and the default,
# for queues still to come), the day a job finished now is purged, and the day after (made a day ahead,
# so a partition is there before its first job, whenever the next round runs). `today`: partitions of
# days before it hold only jobs past their purge_after, and go whole.
HISTORY_DAYS = Query.define(
    "history_days",
    f"""
    SELECT (now() AT TIME ZONE 'UTC')::date AS today,
           array_agg(DISTINCT (now() AT TIME ZONE 'UTC' + make_interval(secs => r, days => d))::date) AS days
    FROM (SELECT retention FROM jobq.queues UNION SELECT {DEFAULT_RETENTION}) t(r), generate_series(0, 1) d
    """,
)

# Forget idempotency keys past their expires_at, a bounded batch per statement like MOVE_FINISHED.
PRUNE_IDEMPOTENCY_KEYS = Query.define(
    "prune_idempotency_keys",
    """
    WITH doomed AS (
        SELECT scope, key FROM jobq.idempotency_keys
        WHERE expires_at <= now()
        ORDER BY expires_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobq.idempotency_keys k USING doomed WHERE k.scope = doomed.scope AND k.key = doomed.key
    """,
)

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

# Rollups (app/service/rollups.py): one replica's counts since its last write, added to the current minute
# of each queue; the lag is the longest any replica saw in the minute.
ROLL_UP = Query.define(
    "roll_up",
    """
    INSERT INTO jobq.rollups AS r (queue, minute, enqueued, completed, failed, dead, lag)
    SELECT queue, date_trunc('minute', now()), enqueued, completed, failed, dead, lag
    FROM unnest(:queues::text[], :enqueued::bigint[], :completed::bigint[], :failed::bigint[],
                :dead::bigint[], :lags::float8[]) AS t(queue, enqueued, completed, failed, dead, lag)
    ON CONFLICT (queue, minute) DO UPDATE
    SET enqueued = r.enqueued + excluded.enqueued, completed = r.completed + excluded.completed,
        failed = r.failed + excluded.failed, dead = r.dead + excluded.dead,
        lag = greatest(r.lag, excluded.lag)
    """,
)

FORGET_ROLLUPS = Query.define(
    "forget_rollups",
    "DELETE FROM jobq.rollups WHERE minute < now() - make_interval(secs => :kept)",
)

# Each queue's jobs completed in the last :span seconds, from the rollups (the queues page).
ROLLUP_COMPLETED = Query.define(
    "rollup_completed",
    f"""
    SELECT queue, sum(completed)::bigint AS completed FROM jobq.rollups
    WHERE minute >= now() - make_interval(secs => :span) AND {_in_scope("queue")}
    GROUP BY queue
    """,
)

# A queue's rollups over the last :span seconds, in steps of :step seconds counted from :origin (a row
# per step with any).
ROLLUP_SERIES = Query.define(
    "rollup_series",
    """
    SELECT date_bin(make_interval(secs => :step), minute, :origin::timestamptz) AS at,
           sum(enqueued)::bigint AS enqueued, sum(completed)::bigint AS completed,
           sum(failed)::bigint AS failed, sum(dead)::bigint AS dead, max(lag) AS lag
    FROM jobq.rollups
    WHERE queue = :queue AND minute >= now() - make_interval(secs => :span)
    GROUP BY 1 ORDER BY 1
    """,
)

# Dead jobs newest first, a page at a time (keyset on id: stable while jobs die meanwhile).
DEAD_JOBS = Query.define(
    "dead_jobs",
    f"""
    SELECT {JOB}
    FROM jobq.jobs j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE j.status = 'dead' AND j.id < :before_id AND {_in_scope("j.queue")}
    ORDER BY j.id DESC
    LIMIT :limit
    """,
)
DEAD_JOBS_IN_QUEUE = Query.define(
    "dead_jobs_in_queue",
    f"""
    SELECT {JOB}
    FROM jobq.jobs j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE j.status = 'dead' AND j.queue = :queue AND j.id < :before_id
    ORDER BY j.id DESC
    LIMIT :limit
    """,
)


# GET /jobs: one page of jobs, newest first, from a window below :before_id of at most :scan jobs, and for
# a search of at most :units units of text (BYTE_UNIT bytes each). The window is what an index answers,
# read lazily newest first: the primary key (every queue), or (queue, id) queue by queue (`queues`: a
# queue named, or the queues of a token's scope, each with a window of its own), and a status's own table.
# Kind, key and the search (:pattern, an ILIKE pattern over the dedup_key, the last error and the
# payload's text) are checked within the window only, so no page reads more than :scan rows however rare
# its matches among millions of finished jobs, and a scope never reads another queue's rows: a filter on
# the queue inside a walk of the primary key would read every foreign job newer than the scope's to fill
# the window.
# A search's bound is the text it reads, not what the rows take on disk (a payload of 100 KB of JSON may
# be stored in 14 KB, and searching it costs its 100 KB). A job weighs a unit and one more per BYTE_UNIT
# bytes of its text; the window stops at the job that reaches :units: each job is a row per unit, counted
# by a count(*) OVER that PostgreSQL stops at :units (a run condition: it reads no further job), so no job
# past the bound has its payload turned into text (but the one after a job that ends on the bound
# exactly). A page without a search has no bytes to count (the LIST_WINDOW without `_search`).
# LIST_WINDOW answers a window's matches, newest first, up to :limit (a page that fills stops reading
# there), and its last row when the window ended before the jobs did (full_rows: :scan read, full_bytes:
# :units searched), which tells where the next page starts (app/service/operators.py list_jobs); LIST_PAGE
# then reads the page's jobs. A status reads only where jobs of that status are (`status`: "active" or
# "finished", the tables of LIST_SOURCES; a status a table cannot hold would walk all its rows for none):
# pending, running and dead jobs are in jobq.jobs; completed and cancelled ones in jobs_history, or in
# jobq.jobs still where an older release left them (all_jobs).
LIST_SOURCES = {None: "jobq.all_jobs", "active": "jobq.jobs", "finished": "jobq.all_jobs"}
HISTORY_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.CANCELLED})

# A search counts the text it reads in units of this many bytes (LIST_WINDOW): a job of less is one row,
# so that counting costs a search over small jobs little (each row counted costs about a microsecond).
BYTE_UNIT = 256


def list_filters(queues: bool, status: str | None, search: bool) -> tuple[bool, str | None, bool]:
    """The key of LIST_WINDOW for a page read queue by queue (or not), with this status (where it is
    held: LIST_PAGE's key) and a search (or not)."""
    held = None if status is None else "finished" if status in HISTORY_STATUSES else "active"
    return queues, held, search


def _list_window(queues: bool, status: str | None, search: bool) -> Query:
    where = ["j.id < :before_id"]
    keys = ["id"]  # the window's order, newest first
    if queues:
        # The queue as a range of one, and first in the order: only a (queue, id) index gives that order,
        # so the plan reads the queue's jobs alone. With `j.queue = s.queue`, a constant, the order would
        # be id's alone, and the planner, which knows no queue's share of the rows here (the queue is the
        # lateral's, not a parameter), could walk the primary key and filter: every newer job of every
        # other queue read.
        where.append("j.queue >= s.queue AND j.queue <= s.queue")
        keys = ["queue", "id"]
    if status:
        where.append("j.status = :status")

    def order(alias: str) -> str:
        return ", ".join(f"{alias}.{key} DESC" for key in keys)

    # Without a search, no bytes to count: each job is a row, its place in the window row_number().
    window = f"""
        SELECT w.id, w.matched, w.n = :scan AS full_rows, false AS full_bytes
        FROM (
            SELECT {", ".join(f"j.{key}" for key in keys)}, row_number() OVER seen AS n,
                   (:kind::text IS NULL OR j.kind = :kind::text)
                   AND (:key::text IS NULL OR j.key = :key::text) AS matched
            FROM (
                SELECT {", ".join(f"j.{key}" for key in keys)}, j.kind, j.key
                FROM {LIST_SOURCES[status]} j
                WHERE {" AND ".join(where)}
                ORDER BY {order("j")}
                LIMIT :scan
            ) j
            WINDOW seen AS (ORDER BY {order("j")} ROWS UNBOUNDED PRECEDING)
        ) w
        WHERE w.matched OR w.n = :scan
        ORDER BY {order("w")}
        LIMIT :limit"""
    if search:
        window = f"""
        SELECT w.id, w.matched, w.n = :scan AS full_rows, w.read + w.weight - 1 >= :units AS full_bytes
        FROM (
            SELECT {", ".join(f"u.{key}" for key in keys)}, u.matched, u.weight, u.first,
                   count(*) FILTER (WHERE u.first) OVER seen AS n, count(*) OVER seen AS read
            FROM (
                SELECT y.*, unnest(ARRAY[true] || array_fill(false, ARRAY[y.weight - 1])) AS first
                FROM (
                    SELECT {", ".join(f"j.{key}" for key in keys)},
                           (:kind::text IS NULL OR j.kind = :kind::text)
                           AND (:key::text IS NULL OR j.key = :key::text)
                           AND (j.dedup_key ILIKE :pattern OR j.last_error ILIKE :pattern
                                OR j.text ILIKE :pattern) AS matched,
                           1 + (octet_length(j.text) + coalesce(octet_length(j.last_error), 0)
                                + coalesce(octet_length(j.dedup_key), 0)) / {BYTE_UNIT} AS weight
                    FROM (
                        SELECT {", ".join(f"j.{key}" for key in keys)}, j.kind, j.key, j.dedup_key,
                               j.last_error, j.payload::text AS text
                        FROM {LIST_SOURCES[status]} j
                        WHERE {" AND ".join(where)}
                        ORDER BY {order("j")}
                        LIMIT :scan
                    ) j
                    ORDER BY {order("j")}
                    OFFSET 0  -- each job's match and weight once, not once per unit of it
                ) y
                ORDER BY {order("y")}
            ) u
            WINDOW seen AS (ORDER BY {order("u")} ROWS UNBOUNDED PRECEDING)
        ) w
        WHERE w.read <= :units AND w.first AND (w.matched OR w.n = :scan OR w.read + w.weight - 1 >= :units)
        ORDER BY {order("w")}
        LIMIT :limit"""
    if queues:
        window = f"SELECT p.* FROM unnest(:queues::text[]) AS s(queue) CROSS JOIN LATERAL ({window}) p"
    name = f"list_window{'_queues' * queues}{f'_{status}' if status else ''}{'_search' * search}"
    return Query.define(name, window)


def _list_page(status: str | None) -> Query:
    return Query.define(
        f"list_page{f'_{status}' if status else ''}",
        f"""
        SELECT {JOB}
        FROM {LIST_SOURCES[status]} j LEFT JOIN jobq.queues q ON q.name = j.queue
        WHERE j.id = ANY(:ids::bigint[])
        ORDER BY j.id DESC
        """,
    )


LIST_WINDOW = {
    (queues, status, search): _list_window(queues, status, search)
    for queues in (False, True)
    for status in LIST_SOURCES
    for search in (False, True)
}
LIST_PAGE = {status: _list_page(status) for status in LIST_SOURCES}

# The queues a token's scope admits, by name: those a page of GET /jobs reads one by one. Every job's
# queue has a row (an enqueue makes it, DeleteQueue takes the jobs with it).
SCOPE_QUEUES = Query.define(
    "scope_queues",
    """
    SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM jobq.queues
    WHERE name LIKE ANY(:scope::text[])
    """,
)

# Dead jobs back to pending, attempts reset, ready now: by ids, by queue, or both (their intersection),
# one page of :batch ids below :before_id at a time; jobs outside :scope are not candidates.
# A dedup_key may be active once per queue: a dead job whose key an active job holds is skipped, and of
# several dead jobs sharing a key only the newest is retried. Every candidate comes back with `retried`.
RETRY_DEAD = Query.define(
    "retry_dead",
    f"""
    WITH candidates AS (
        SELECT id, queue, dedup_key FROM jobq.jobs
        WHERE status = 'dead' AND id < :before_id
          AND (:ids::bigint[] IS NULL OR id = ANY(:ids::bigint[]))
          AND (:queue::text IS NULL OR queue = :queue::text) AND {_in_scope("queue")}
        ORDER BY id DESC
        LIMIT :batch
        FOR UPDATE
    ), chosen AS (
        SELECT id FROM candidates WHERE dedup_key IS NULL
        UNION ALL
        SELECT * FROM (
            SELECT DISTINCT ON (c.queue, c.dedup_key) c.id FROM candidates c
            WHERE c.dedup_key IS NOT NULL AND NOT EXISTS (
                SELECT FROM jobq.jobs a
                WHERE a.queue = c.queue AND a.dedup_key = c.dedup_key AND a.status IN ('pending', 'running'))
            ORDER BY c.queue, c.dedup_key, c.id DESC
        ) newest
    ), retried AS (
        UPDATE jobq.jobs j
        SET status = 'pending', attempts = 0, run_at = now(), lease_token = NULL, lease_expires_at = NULL,
            updated_at = now()
        FROM chosen WHERE j.id = chosen.id AND j.status = 'dead'
        RETURNING j.id, j.queue, j.run_at
    ), {_notify("retried")}
    SELECT c.id, r.id IS NOT NULL AS retried
    FROM candidates c LEFT JOIN retried r ON r.id = c.id
    WHERE {NOTIFIED}
    ORDER BY c.id DESC
    """,
)

PURGE_DEAD = Query.define(
    "purge_dead",
    f"DELETE FROM jobq.jobs WHERE id = :id AND status = 'dead' AND {_in_scope('queue')} RETURNING id",
)
# The dashboard's selection of dead jobs, purged; the ids that were dead (and in scope) come back.
PURGE_DEAD_JOBS = Query.define(
    "purge_dead_jobs",
    f"""DELETE FROM jobq.jobs
    WHERE id = ANY(:ids::bigint[]) AND status = 'dead' AND {_in_scope("queue")} RETURNING id""",
)

# SQS PurgeQueue: every message of the queue, visible or in flight; dead ones stay (they are the queue's
# dead letters, which SQS would keep in another queue).
PURGE_QUEUE = Query.define(
    "purge_queue",
    f"""
    DELETE FROM jobq.jobs j WHERE queue = :queue AND status IN ('pending', 'running')
    RETURNING {_notify_done()}
    """,
)

# SQS MessageRetentionPeriod: messages a receive leased and found sent more than :retention seconds ago,
# deleted as SQS deletes them, each fenced by the lease that receive took (app/sqs/messages.py). A key's
# slot freed this way wakes the queue's long-polls, as an ack's does.
EXPIRE_MESSAGES = Query.define(
    "expire_messages",
    f"""
    WITH gone AS (
        DELETE FROM jobq.jobs j
        USING unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[]) AS r(id, queue, lease_token)
        WHERE j.id = r.id AND j.queue = r.queue AND j.lease_token = r.lease_token AND j.status = 'running'
          AND j.created_at <= now() - make_interval(secs => :retention)
        RETURNING j.id, j.queue, j.key, j.run_at, {_notify_done()}
    ), {_notify("gone", KEY_FREED)}
    SELECT id FROM gone WHERE {NOTIFIED}
    """,
)

# SQS redrive: the dead jobs of each queue whose RedrivePolicy names another queue that exists (its
# deadLetterTargetArn's last field, SQS names holding no colon) move into that queue, pending and
# receivable there as SQS moves a message past its maxReceiveCount into the dead-letter queue; each move is
# noted in sqs_dead_letters, so StartMessageMoveTask can take the message back to where it came from. A
# moved job starts over in its new queue: attempts 0, that queue's max_attempts, no dedup_key (the
# dead-letter queue deduplicates nothing of the source's); its key, payload, message attributes and
# last_error stay. Jobs enter the target as an enqueue does, under its queue lock (the queue row made again
# if a DeleteQueue just took it). A bounded batch, SKIP LOCKED: every replica may run it.
REDRIVE_DEAD = Query.define(
    "redrive_dead",
    f"""
    WITH policies AS (
        SELECT name AS source,
               substring((sqs_attributes ->> 'RedrivePolicy')::jsonb ->> 'deadLetterTargetArn'
                         FROM '^(?:[^:]*:){{5}}([^:]+)$') AS target
        FROM jobq.queues
        WHERE coalesce(sqs_attributes ->> 'RedrivePolicy', '') <> ''
    ), doomed AS (
        SELECT j.id, p.source, p.target AS queue
        FROM jobq.jobs j
        JOIN policies p ON p.source = j.queue
        JOIN jobq.queues t ON t.name = p.target AND t.name <> p.source
        WHERE j.status = 'dead'
        ORDER BY j.id
        LIMIT :batch
        FOR UPDATE OF j SKIP LOCKED
    ), {_queues_made("doomed")}, moved AS (
        UPDATE jobq.jobs j
        SET status = 'pending', queue = d.queue, attempts = 0, max_attempts = NULL, dedup_key = NULL,
            run_at = now(), lease_token = NULL, lease_expires_at = NULL, worker_id = NULL, updated_at = now()
        FROM doomed d
        WHERE j.id = d.id AND j.status = 'dead' AND {LOCKED}
        RETURNING j.id, j.queue, j.key, j.run_at, d.source
    ), noted AS (
        INSERT INTO jobq.sqs_dead_letters (job_id, source) SELECT id, source FROM moved
        ON CONFLICT (job_id) DO UPDATE SET source = excluded.source
    ), {_notify("moved")}
    SELECT id, source, queue FROM moved WHERE {NOTIFIED}
    """,
)

# SQS StartMessageMoveTask on a dead-letter queue (:dlq): its visible messages that REDRIVE_DEAD brought
# from one of :sources go back to the queue each came from, to be received again from the start (attempts
# 0); their notes are dropped. A bounded batch; the caller loops while batches come back full.
RETURN_DEAD_LETTERS = Query.define(
    "return_dead_letters",
    f"""
    WITH back AS (
        SELECT j.id, l.source AS queue
        FROM jobq.sqs_dead_letters l JOIN jobq.jobs j ON j.id = l.job_id
        WHERE j.queue = :dlq AND j.status = 'pending' AND l.source = ANY(:sources::text[])
        ORDER BY j.id
        LIMIT :batch
        FOR UPDATE OF j SKIP LOCKED
    ), {_queues_made("back")}, moved AS (
        UPDATE jobq.jobs j
        SET queue = b.queue, attempts = 0, max_attempts = NULL, run_at = now(), updated_at = now()
        FROM back b
        WHERE j.id = b.id AND j.status = 'pending' AND {LOCKED}
        RETURNING j.id, j.queue, j.run_at
    ), forgotten AS (
        DELETE FROM jobq.sqs_dead_letters WHERE job_id IN (SELECT id FROM moved)
    ), {_notify("moved")}
    SELECT count(*) AS moved FROM moved WHERE {NOTIFIED}
    """,
)

# The notes of REDRIVE_DEAD whose job left its dead-letter queue otherwise (done, deleted, purged): dropped
# with retention pruning, a bounded batch at a time.
FORGET_DEAD_LETTERS = Query.define(
    "forget_dead_letters",
    """
    WITH gone AS (
        SELECT l.job_id FROM jobq.sqs_dead_letters l
        WHERE NOT EXISTS (SELECT FROM jobq.jobs j WHERE j.id = l.job_id AND j.queue <> l.source)
        LIMIT :batch
    )
    DELETE FROM jobq.sqs_dead_letters l USING gone WHERE l.job_id = gone.job_id
    """,
)

# SQS DeleteQueue, first: the queue's lock, exclusively (QUEUE_LOCK_CLASS), in a statement of its own, in
# DELETE_QUEUE's transaction. It waits for every enqueue into the queue in flight, an application's open
# transaction that called jobq.enqueue() included; DELETE_QUEUE, which starts after, sees their jobs and
# deletes them too. An enqueue arriving meanwhile waits for the delete to commit, then creates the queue
# row again with its job. So no job outlives its queue row.
LOCK_QUEUE = Query.define(
    "lock_queue",
    f"SELECT pg_advisory_xact_lock({QUEUE_LOCK_CLASS}, hashtext(:queue))",
)

# SQS DeleteQueue: the queue and every job it holds, in any status (after LOCK_QUEUE).
DELETE_QUEUE = Query.define(
    "delete_queue",
    """
    WITH gone AS (DELETE FROM jobq.jobs WHERE queue = :queue),
         finished AS (DELETE FROM jobq.jobs_history WHERE queue = :queue)
    DELETE FROM jobq.queues WHERE name = :queue RETURNING name
    """,
)

JOB_STATUS = Query.define(
    "job_status", f"SELECT status FROM jobq.all_jobs WHERE id = :id AND {_in_scope('queue')}"
)

# Per-queue counts. `pending` is ready now; `scheduled` waits for a future run_at (both are state pending).
# The oldest ready job's age is the lag behind run_at, the first sign of workers falling behind.
QUEUE_STATS = Query.define(
    "queue_stats",
    f"""
    SELECT q.name AS queue,
           coalesce(s.pending, 0) AS pending, coalesce(s.scheduled, 0) AS scheduled,
           coalesce(s.running, 0) AS running, coalesce(s.dead, 0) AS dead,
           coalesce(s.completed, 0) AS completed,
           coalesce(extract(epoch FROM now() - s.oldest_ready), 0)::float8 AS oldest_pending_age_seconds,
           q.paused,
           q.visibility_timeout, q.max_attempts, q.backoff_base, q.backoff_cap, q.retention,
           q.key_concurrency, q.fair, q.rate_limit, q.rate_period, q.key_rate_limit, q.key_rate_period
    FROM jobq.queues q
    LEFT JOIN (
        SELECT queue,
               count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
               count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'dead') AS dead,
               count(*) FILTER (WHERE status = 'completed') AS completed,
               min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest_ready
        FROM jobq.all_jobs
        WHERE status <> 'cancelled' AND (:queue::text IS NULL OR queue = :queue::text)
          AND {_in_scope("queue")}
        GROUP BY queue
    ) s ON s.queue = q.name
    WHERE (:queue::text IS NULL OR q.name = :queue::text) AND {_in_scope("q.name")}
    ORDER BY q.name
    """,
)

# A queue's cancelled jobs not yet pruned, for its dashboard page (QUEUE_STATS, and so GET /queues, counts
# none). Cancelled jobs are in jobq.jobs_history alone; its key starts with the queue.
QUEUE_CANCELLED = Query.define(
    "queue_cancelled",
    "SELECT count(*) FROM jobq.jobs_history WHERE queue = :queue AND status = 'cancelled'",
)

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
    ), s AS (
        SELECT queue,
               count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
               count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'dead') AS dead,
               min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest_ready
        FROM active
        GROUP BY queue
    )
    SELECT q.name AS queue, q.paused,
           coalesce(s.pending, 0) AS pending, coalesce(s.scheduled, 0) AS scheduled,
           coalesce(s.running, 0) AS running, coalesce(s.dead, 0) AS dead,
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


# Create a queue or change its settings; a NULL argument keeps the current value (or the default).
# Flow-control settings come as :flow, a JSON object holding only those to change (a null clears one):
# {"key_concurrency": 2, "fair": true, "rate": {"limit": 100, "period": 60}, "key_rate": null}. The
# queue's row stays locked to the end of the transaction, which then runs SET_FLOW.
def _flow_setting(name: str, value: str, current: str) -> str:
    return f"CASE WHEN :flow::jsonb ? '{name}' THEN {value} ELSE {current} END"


CONFIGURE_QUEUE = Query.define(
    "configure_queue",
    f"""
    INSERT INTO jobq.queues AS q
        (name, visibility_timeout, max_attempts, backoff_base, backoff_cap, retention)
    VALUES (:queue, coalesce(:visibility_timeout::float8, {DEFAULT_VISIBILITY_TIMEOUT}),
            coalesce(:max_attempts::int, {DEFAULT_MAX_ATTEMPTS}),
            coalesce(:backoff_base::float8, {DEFAULT_BACKOFF_BASE}),
            coalesce(:backoff_cap::float8, {DEFAULT_BACKOFF_CAP}),
            coalesce(:retention::float8, {DEFAULT_RETENTION}))
    ON CONFLICT (name) DO UPDATE SET
        visibility_timeout = coalesce(:visibility_timeout::float8, q.visibility_timeout),
        max_attempts = coalesce(:max_attempts::int, q.max_attempts),
        backoff_base = coalesce(:backoff_base::float8, q.backoff_base),
        backoff_cap = coalesce(:backoff_cap::float8, q.backoff_cap),
        retention = coalesce(:retention::float8, q.retention),
        updated_at = now()
    RETURNING name
    """,
)
_FLOW_COLUMNS = {
    "key_concurrency": ("key_concurrency", "(:flow::jsonb->>'key_concurrency')::int"),
    "fair": ("fair", "coalesce((:flow::jsonb->>'fair')::boolean, false)"),
    "rate_limit": ("rate", "(:flow::jsonb->'rate'->>'limit')::int"),
    "rate_period": ("rate", "(:flow::jsonb->'rate'->>'period')::float8"),
    "key_rate_limit": ("key_rate", "(:flow::jsonb->'key_rate'->>'limit')::int"),
    "key_rate_period": ("key_rate", "(:flow::jsonb->'key_rate'->>'period')::float8"),
}
CONFIGURE_FLOW = Query.define(
    "configure_flow",
    f"""
    UPDATE jobq.queues SET
        {", ".join(f"{col} = {_flow_setting(*setting, col)}" for col, setting in _FLOW_COLUMNS.items())}
    WHERE name = :queue
    """,
)

# After a change of a queue's flow-control settings or of a key's overrides, in the same transaction (the
# queue's row locked by its first statement, so that this one, which starts later, sees every change
# committed before): whether the queue is now under flow control, and a notification that makes every
# replica read it again (app/service/flow.py) and wakes the queue's long-polls to look again.
SET_FLOW = Query.define(
    "set_flow",
    f"""
    WITH changed AS (
        UPDATE jobq.queues q
        SET flow = key_concurrency IS NOT NULL OR fair OR rate_limit IS NOT NULL
                   OR key_rate_limit IS NOT NULL
                   OR EXISTS (SELECT FROM jobq.keys k
                              WHERE k.queue = q.name
                                AND (k.concurrency IS NOT NULL OR k.rate_limit IS NOT NULL)),
            updated_at = now()
        WHERE name = :queue
        RETURNING name, flow
    )
    SELECT flow, pg_notify('{CHANNEL}', json_build_object(
               'queue', name, 'n', {2**31 - 1}, 'run_at', extract(epoch FROM now()), 'settings', true)::text)
    FROM changed
    """,
)

# Whether a queue has a row: a filter naming a queue that has none is answered 404, not an empty list.
QUEUE_EXISTS = Query.define("queue_exists", "SELECT EXISTS (SELECT FROM jobq.queues WHERE name = :queue)")

# A queue's flow-control settings, as the lease reads them (NULL: the queue does not exist).
QUEUE_FLOW = Query.define(
    "queue_flow",
    """
    SELECT flow, key_concurrency, fair,
           rate_limit IS NOT NULL OR key_rate_limit IS NOT NULL
           OR EXISTS (SELECT FROM jobq.keys k WHERE k.queue = q.name AND k.rate_limit IS NOT NULL) AS rated
    FROM jobq.queues q WHERE name = :queue
    """,
)

# The queue's row, created if need be, locked for the rest of the transaction (a key's overrides change
# under it, then SET_FLOW).
LOCK_QUEUE_ROW = Query.define(
    "lock_queue_row",
    """
    INSERT INTO jobq.queues AS q (name) VALUES (:queue)
    ON CONFLICT (name) DO UPDATE SET updated_at = now()
    """,
)

# --- keys (flow control's per-key view and overrides) ---------------------------------------------


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

# Pause or resume a queue (creating it if need be, so a queue can be paused before its first job).
# Resuming wakes the queue's waiters: its ready jobs (counted up to 1000) are leasable again.
SET_PAUSED = Query.define(
    "set_paused",
    f"""
    WITH changed AS (
        INSERT INTO jobq.queues AS q (name, paused) VALUES (:queue, :paused)
        ON CONFLICT (name) DO UPDATE SET paused = :paused, updated_at = now()
        RETURNING name, paused
    ), ready AS (
        SELECT changed.name AS queue, j.run_at
        FROM changed, LATERAL (
            SELECT run_at FROM jobq.jobs
            WHERE jobs.queue = changed.name AND status = 'pending' AND run_at <= now() LIMIT 1000
        ) j
        WHERE NOT changed.paused
    ), {_notify("ready")}
    SELECT count(*) FROM changed WHERE {NOTIFIED}
    """,
)


# --- schedules (app/service/schedules.py) -------------------------------------------------------------

SCHEDULE = """
    s.name, s.cron, s.timezone, s.queue, s.payload, s.kind, s.priority, s.max_attempts, s.key, s.catch_up,
    s.paused, s.next_run_at, s.last_run_at, s.last_job_id, s.created_at, s.updated_at
"""

# Create or replace a schedule; the caller has computed next_run_at (NULL while paused). A schedule of a
# queue outside :scope is left alone (no row back).
PUT_SCHEDULE = Query.define(
    "put_schedule",
    f"""
    INSERT INTO jobq.schedules AS s (name, cron, timezone, queue, payload, kind, priority, max_attempts, key,
                                     catch_up, paused, next_run_at)
    VALUES (:name, :cron, :timezone, :queue, :payload::jsonb, :kind, :priority, :max_attempts, :key,
            :catch_up, :paused, :next_run_at)
    ON CONFLICT (name) DO UPDATE SET
        cron = excluded.cron, timezone = excluded.timezone, queue = excluded.queue,
        payload = excluded.payload, kind = excluded.kind, priority = excluded.priority,
        max_attempts = excluded.max_attempts, key = excluded.key, catch_up = excluded.catch_up,
        paused = excluded.paused, next_run_at = excluded.next_run_at, updated_at = now()
    WHERE {_in_scope("s.queue")}
    RETURNING {SCHEDULE}
    """,
)

# One schedule, locked for the rest of the transaction (a change computes its next slot meanwhile).
LOCK_SCHEDULE = Query.define(
    "lock_schedule",
    f"""
    SELECT {SCHEDULE}, now() AS now FROM jobq.schedules s
    WHERE name = :name AND {_in_scope("queue")}
    FOR UPDATE
    """,
)
GET_SCHEDULE = Query.define(
    "get_schedule", f"SELECT {SCHEDULE} FROM jobq.schedules s WHERE name = :name AND {_in_scope('queue')}"
)
# A page of schedules by name, from after :after (NULL: the first), one more than asked for: whether
# there is a next page.
LIST_SCHEDULES = Query.define(
    "list_schedules",
    f"""
    SELECT {SCHEDULE} FROM jobq.schedules s
    WHERE {_in_scope("queue")} AND (:after::text IS NULL OR name > :after)
    ORDER BY name
    LIMIT :limit + 1
    """,
)
DELETE_SCHEDULE = Query.define(
    "delete_schedule",
    f"DELETE FROM jobq.schedules WHERE name = :name AND {_in_scope('queue')} RETURNING name",
)
SET_SCHEDULE_PAUSED = Query.define(
    "set_schedule_paused",
    f"""
    UPDATE jobq.schedules s SET paused = :paused, next_run_at = :next_run_at, updated_at = now()
    WHERE name = :name RETURNING {SCHEDULE}
    """,
)

# The scheduler: the schedules due by the database's clock (as every deadline is), the longest due
# first, with that clock; read without a lock, and fired by FIRE_DUE_SCHEDULES if still as read.
DUE_SCHEDULES = Query.define(
    "due_schedules",
    """
    SELECT name, cron, timezone, catch_up, next_run_at, now() AS now FROM jobq.schedules
    WHERE NOT paused AND next_run_at <= now()
    ORDER BY next_run_at
    LIMIT :batch
    """,
)

# How soon the scheduler should look again (seconds; NULL: no active schedule).
NEXT_DUE = Query.define(
    "next_due",
    "SELECT extract(epoch FROM min(next_run_at) - now())::float8 FROM jobq.schedules WHERE NOT paused",
)

# The job of each slot of :slots (a NULL slot: a trigger), from the schedule's settings, its queue locked
# and created on first use as every enqueue does. A slot whose job is still in jobq.jobs
# (uq_jobs_queue_schedule_slot; no arbiter is named, as releases before 0019 had uq_jobs_schedule_slot
# too) gets no second one; once that job finished it is in jobs_history, which the index does not cover,
# but a slot is fired once all the same: it is fired under the schedule's row lock, which moves
# next_run_at past it in the same transaction (app/service/schedules.py).
FIRE_SCHEDULE = Query.define(
    "fire_schedule",
    f"""
    WITH {_queues_made("jobq.schedules WHERE name = :name")}, j AS (
        INSERT INTO jobq.jobs AS j
            (queue, payload, priority, max_attempts, kind, key, schedule, schedule_slot)
        SELECT s.queue, s.payload, s.priority, s.max_attempts, s.kind, s.key, s.name, slot
        FROM jobq.schedules s, unnest(:slots::timestamptz[]) AS slot
        WHERE s.name = :name AND {LOCKED}
        ORDER BY slot
        ON CONFLICT DO NOTHING
        RETURNING j.id, j.queue, j.run_at
    ), {_notify("j")}
    SELECT max(id) AS last_job_id, count(*) AS jobs FROM j WHERE {NOTIFIED}
    """,
)

# Fire many due schedules in one statement, as app/service/schedules.py planned them: per schedule, the
# next slot it was read with (:firsts), its next slot after this firing and its last slot fired (NULL:
# none fired); per job, its schedule and slot (:slot_names, :slots, each schedule's oldest first).
# - `claimed`: each schedule still as it was planned (same next slot, cron, zone and catch-up, not
#   paused), locked in name order, passing over one another transaction holds (SKIP LOCKED): a schedule
#   fired, paused or changed since it was read, here or on another replica, is not fired again. Locking
#   re-reads a row changed since the statement began (READ COMMITTED), so a firing that committed
#   meanwhile is seen.
# - Job ids are drawn up front, in slot order, so the schedule's last_job_id is known as it moves on
#   (a row cannot be updated twice in one statement).
# - Its queues are locked and made as every enqueue does; a slot whose job is still in jobq.jobs gets no
#   second one (uq_jobs_queue_schedule_slot).
# One row per schedule fired: its name and how many jobs it enqueued.
FIRE_DUE_SCHEDULES = Query.define(
    "fire_due_schedules",
    f"""
    WITH planned AS (
        SELECT * FROM unnest(:names::text[], :firsts::timestamptz[], :crons::text[], :timezones::text[],
                             :catch_ups::text[], :next_run_ats::timestamptz[], :last_run_ats::timestamptz[])
            AS p(name, first, cron, timezone, catch_up, next_run_at, last_run_at)
    ), claimed AS (
        SELECT p.name, p.next_run_at, p.last_run_at
        FROM jobq.schedules s JOIN planned p ON p.name = s.name
        WHERE s.next_run_at = p.first AND NOT s.paused AND s.cron = p.cron AND s.timezone = p.timezone
          AND s.catch_up = p.catch_up
        ORDER BY s.name
        FOR UPDATE OF s SKIP LOCKED
    ), slots AS (
        SELECT nextval('jobq.jobs_id_seq') AS id, f.name, f.slot
        FROM unnest(:slot_names::text[], :slots::timestamptz[]) AS f(name, slot)
        WHERE f.name IN (SELECT name FROM claimed)
    ), last_jobs AS (
        SELECT name, max(id) AS id FROM slots GROUP BY name
    ), advanced AS (
        UPDATE jobq.schedules s
        SET next_run_at = c.next_run_at, last_run_at = coalesce(c.last_run_at, s.last_run_at),
            last_job_id = coalesce(l.id, s.last_job_id)
        FROM claimed c LEFT JOIN last_jobs l ON l.name = c.name
        WHERE s.name = c.name
        RETURNING s.name, s.queue, s.payload, s.priority, s.max_attempts, s.kind, s.key
    ), {_queues_made("advanced")}, j AS (
        INSERT INTO jobq.jobs AS j
            (id, queue, payload, priority, max_attempts, kind, key, schedule, schedule_slot)
        SELECT slots.id, a.queue, a.payload, a.priority, a.max_attempts, a.kind, a.key, a.name, slots.slot
        FROM advanced a JOIN slots ON slots.name = a.name
        WHERE {LOCKED}
        ORDER BY slots.id
        ON CONFLICT DO NOTHING
        RETURNING j.id, j.queue, j.run_at, j.schedule
    ), {_notify("j")}, per_schedule AS (
        SELECT schedule AS name, count(*) AS jobs FROM j GROUP BY schedule
    )
    SELECT a.name, coalesce(n.jobs, 0)::int AS jobs
    FROM advanced a LEFT JOIN per_schedule n ON n.name = a.name
    WHERE {NOTIFIED}
    """,
)

# After firing: the next slot, and the last slot fired with its job (kept when nothing was fired).
ADVANCE_SCHEDULE = Query.define(
    "advance_schedule",
    """
    UPDATE jobq.schedules
    SET next_run_at = coalesce(:next_run_at, next_run_at), last_run_at = coalesce(:last_run_at, last_run_at),
        last_job_id = coalesce(:last_job_id, last_job_id)
    WHERE name = :name
    """,
)

# Leadership of one-replica work (the scheduler): taken when free or expired, renewed by its holder, and
# held until :ttl seconds from now on the database's clock. A row back: this holder leads.
TAKE_LEAD = Query.define(
    "take_lead",
    """
    INSERT INTO jobq.leaders AS l (name, holder, expires_at)
    VALUES (:name, :holder, now() + make_interval(secs => :ttl))
    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE l.holder = excluded.holder OR l.expires_at < now()
    RETURNING holder
    """,
)
GIVE_UP_LEAD = Query.define(
    "give_up_lead", "DELETE FROM jobq.leaders WHERE name = :name AND holder = :holder"
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
