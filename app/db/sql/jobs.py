"""One job by id, as operators and producers reach it: read, cancelled, run now, or watched by a waiter
(GET /jobs/{id}?wait=N).
"""

from __future__ import annotations

from app.db.sql.fragments import (
    _CANCELLED,
    JOB,
    JOB_COLUMNS,
    KEY_FREED,
    NOTIFIED,
    _in_scope,
    _notify,
    _notify_done,
)
from app.db.sql.query import Query

GET_JOB = Query.define(
    "get_job",
    f"""
    SELECT {JOB} FROM jobq.all_jobs j LEFT JOIN jobq.queues q ON q.name = j.queue
    WHERE j.id = :id AND {_in_scope("j.queue")}
    """,
)

# Jobs by id, in id order: an enqueue of jobs with parents answers with them as they are once linked. Read
# from both tables past any purge_after (unlike jobq.all_jobs): a job its parents cancelled at once, in a
# queue whose retention is 0, is answered too.
_COLUMNS = ", ".join(JOB_COLUMNS)
GET_JOBS = Query.define(
    "get_jobs",
    f"""
    SELECT {JOB}
    FROM (SELECT {_COLUMNS} FROM jobq.jobs WHERE id = ANY(:ids::bigint[])
          UNION ALL
          SELECT {_COLUMNS} FROM jobq.jobs_history WHERE id = ANY(:ids::bigint[])) j
    LEFT JOIN jobq.queues q ON q.name = j.queue
    ORDER BY j.id
    """,
)


# A cancelled job that held its in-order key's place (fragments.KEY_HOLDER, read off the row as it was:
# pending or waiting) lets the key's next job go.
_HELD_KEY = "(attempts > 0 OR sleep_until IS NOT NULL OR wait_event IS NOT NULL)"


# Cancel jobs that have not started (CANCEL: one, CANCEL_JOBS: the dashboard's selection), pending or
# waiting for their parents, moving them to jobq.jobs_history. Running, finished and dead jobs are left
# alone. A cancelled job's own children are then decided (the trigger job_gone).
def _cancel(which: str) -> str:
    return f"""
    WITH taken AS (
        DELETE FROM jobq.jobs j USING jobq.queues q
        WHERE {which} AND j.status IN ('pending', 'waiting') AND q.name = j.queue AND {_in_scope("j.queue")}
        RETURNING j.*
    ), j AS ({_CANCELLED}
        RETURNING j.*, {_notify_done()}
    ), cancelled AS (
        SELECT {JOB}, j.done FROM j LEFT JOIN jobq.queues q ON q.name = j.queue
    ), {_notify("cancelled", f"{KEY_FREED} AND {_HELD_KEY}")}
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

JOB_STATUS = Query.define(
    "job_status", f"SELECT status FROM jobq.all_jobs WHERE id = :id AND {_in_scope('queue')}"
)
