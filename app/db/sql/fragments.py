"""The SQL that statements of several topics share, spliced into them at import: a job's columns as the
API and a lease show it, the move of finished jobs into jobq.jobs_history, the wake-ups (NOTIFY), the
queue locks every insert of jobs takes, a token's scope, and the clock of rate windows.
"""

from __future__ import annotations

from app.core.limits import DEFAULT_MAX_ATTEMPTS, DEFAULT_RETENTION

# A job's durable record (API part 8, app/service/durable.py): its recorded steps and the events that
# reached it, read from jobq.job_journal for a job marked `journaled`. They live beside the job's row, not
# in it: every lease rewrites the row, and each ack copies it into jobs_history; a row that carried them
# would write their size again each time (the bare claim of jobs with 10 steps of 60 bytes went from 0.75
# to 0.81-0.85 of the rate of jobs without, in alternating runs). For a job without (NULL `journaled`),
# each subquery stops at its one-time filter: no index read. (A lease reads both with one subquery: two
# cost an index read more, about 4 % of the claim; joining the journal in the claim's CTEs instead was
# four times slower.)
JOURNAL = """(SELECT r.steps FROM jobq.job_journal r WHERE j.journaled AND r.job_id = j.id) AS steps,
    (SELECT r.events FROM jobq.job_journal r WHERE j.journaled AND r.job_id = j.id) AS events"""
# The same for a lease, in one index read: both in one array (steps, events), which the service parts
# (app/service/rows.py); NULL for a job without.
LEASED_JOURNAL = (
    "(SELECT ARRAY[r.steps, r.events] FROM jobq.job_journal r WHERE j.journaled AND r.job_id = j.id)"
    " AS journal"
)

# The columns of a job as the API shows it. `max_attempts` NULL on the job means "the queue's setting",
# so it is resolved against the queue row `q` (absent only in the statement that creates the queue).
JOB = f"""
    j.id, j.queue, j.kind, j.key, j.status, j.payload, j.priority, j.run_at, j.attempts,
    coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts,
    j.dedup_key, j.last_error, j.lease_expires_at, j.created_at, j.updated_at, j.completed_at,
    j.result, j.progress, j.schedule, j.schedule_slot, j.worker_id, j.traceparent, j.tracestate,
    j.depends_on, j.run_if, j.workflow_id, j.delivery, {JOURNAL}, j.wait_event, j.sleep_until
"""

# The columns of a job as a lease hands it out: the job, its lease, and no more (a lease of 1,000 jobs
# decodes every column of every row). `depends_on` (NULL but for a job with parents) tells the service
# whose parents' results to fetch for the lease (app/service/leasing.py); it is not handed out itself.
# `steps` and `events` (API part 8, LEASED_JOURNAL) are handed out when the job has some.
LEASED_JOB = f"""
    j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
    coalesce(j.max_attempts, q.max_attempts, {DEFAULT_MAX_ATTEMPTS}) AS max_attempts,
    j.run_at, j.created_at, j.last_error, j.lease_token, j.lease_expires_at, j.traceparent, j.tracestate,
    j.depends_on, {LEASED_JOURNAL}
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
# A job's columns, in jobq.jobs_history's order (app/db/tables.py, JobColumns; tests/service/test_tables.py
# holds the two together), written out: the service does not load the table models.
JOB_COLUMNS = (
    "id", "queue", "status", "payload", "priority", "run_at", "attempts", "max_attempts", "dedup_key",
    "last_error", "lease_token", "lease_expires_at", "worker_id", "created_at", "updated_at",
    "completed_at", "message_attributes", "first_received_at", "kind", "result", "progress", "awaited",
    "key", "schedule", "schedule_slot", "traceparent", "tracestate", "depends_on", "run_if", "workflow_id",
    "has_children", "debounce_key", "debounce_until", "delivery", "journaled", "wait_event", "sleep_until",
)  # fmt: skip


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
    {
        "status": "'completed'",
        "lease_expires_at": "NULL",
        "result": "m.acked_result::jsonb",
        "delivery": "coalesce(m.acked_delivery::jsonb, m.delivery)",
        **_FINISHED_NOW,
    },
)
_CANCELLED = _to_history("taken", {"status": "'cancelled'", **_FINISHED_NOW})
_MOVED = _to_history(
    "(SELECT j.* FROM jobq.jobs j JOIN doomed USING (id))",
    {},
    finished="m.completed_at",
    where=f"m.completed_at + {RETAINED} > now()",
)


# The key of a kept SQS RedrivePolicy that notes the jobq queue its deadLetterTargetArn names in the source
# queue's region (a queue of another region than the default one is named `<region>:<name>`:
# app/sqs/regions.py), set with the policy (app/sqs/queues.py) and never shown (app/sqs/attributes.py). Kept
# inside the policy, so that a policy replaced by a replica that does not note it can never be read with
# another's queue.
DEAD_LETTER_KEY = "jobqQueue"


# The queue a queue's SQS RedrivePolicy moves its dead letters into (`q`: the queue's jobq.queues row): the
# jobq queue noted in the policy when it was set (DEAD_LETTER_KEY), or for a policy set before regions, or
# by a replica older than them, the deadLetterTargetArn's last field, as those replicas read it. NULL for a
# queue without a policy.
def dead_letter_target(q: str) -> str:
    policy = f"(nullif({q}.sqs_attributes ->> 'RedrivePolicy', ''))::jsonb"
    return (
        f"coalesce({policy} ->> '{DEAD_LETTER_KEY}',"
        f" substring({policy} ->> 'deadLetterTargetArn' FROM '^(?:[^:]*:){{5}}([^:]+)$'))"
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

# A job that holds its place at the head of an in-order key (key_concurrency 1) while it is not running: it
# has begun and not ended, so its key's later jobs wait for it. Pending again for its retry (attempts > 0),
# or after a sleep or a wait for an event (sleep_until: when that ended; a release counts no attempt, so
# attempts may be 0), asleep, or parked on an event. The index ix_jobs_key_held holds these jobs and the
# running ones. `h`: the alias of jobq.jobs in the statement.
KEY_HOLDER = """(h.status = 'pending' AND (h.attempts > 0 OR h.sleep_until IS NOT NULL)
                    OR h.status = 'waiting' AND h.wait_event IS NOT NULL)"""

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
# creates the queue row again. jobq.enqueue() takes it too (app/db/functions.sql, with the same numbers).
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


# Scopes: a token or SQS key may be limited to some queues (app/core/access.py). Statements that find jobs by
# id, or list queues or dead jobs, take its patterns as :scope, as LIKE patterns (`celery-%`, with `_`
# escaped), or NULL for every queue. A job outside them is not found, in the same statement: no extra
# round trip, and the same answer as a job that does not exist.
def _in_scope(column: str) -> str:
    return f"(:scope::text[] IS NULL OR {column} LIKE ANY(:scope::text[]))"


# The sum of a rate window's counts within its last `period` seconds.
# Rate windows run on statement_timestamp(), the claim statement's own start, not now() (its
# transaction's): a claim runs after it holds its key's (or queue's) lock, so the claims of one window take
# their times in the order they held it. By now() a claim that began before another but got the lock after
# it would read a window the other had already pruned past its own start, and could lease one too many.
WINDOW_CLOCK = "statement_timestamp()"


def _used(times: str, counts: str, period: str) -> str:
    return f"""(SELECT coalesce(sum(c), 0) FROM unnest({times}, {counts}) AS w(t, c)
               WHERE t > {WINDOW_CLOCK} - make_interval(secs => {period}))"""
