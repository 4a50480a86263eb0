"""Durable steps, sleeps and events (API part 8; app/service/durable.py): a step's result recorded under the
lease, a job parked until an event (jobq.await_event(), app/db/functions.sql) or made pending by one
(jobq.send_event()), waits that ran out, and the events kept for later awaits. A sleep is a RELEASE with a
delay (app/db/sql/ends.py).
"""

from __future__ import annotations

from app.db.sql.fragments import NOTIFIED, _notify
from app.db.sql.query import Query

# Record a step's result with a running job, under its current lease token, unless a step of that name is
# recorded already (the first write wins) or the job's steps would pass :limit bytes as JSON text (what a
# lease hands out). The job's row is updated first (marked `journaled`), under the token: that row lock
# orders the write after any lease or expiry of the job, and a later step of the same job after this one,
# so two steps recorded at once both stay (the journal's row is written by ON CONFLICT on the row as it is
# then). No row back: the lease is not current, the name is taken, or the steps would be too large
# (STEP_REFUSED says which); nothing is kept then but the job's `updated_at`.
RECORD_STEP = Query.define(
    "record_step",
    """
    WITH held AS (
        UPDATE jobq.jobs j SET journaled = true, updated_at = now()
        WHERE j.id = :id AND j.queue = :queue AND j.lease_token = :lease_token AND j.status = 'running'
        RETURNING j.id
    ), step AS (
        SELECT jsonb_build_object(:name::text, :result::jsonb) AS step
    )
    INSERT INTO jobq.job_journal AS r (job_id, steps)
    SELECT held.id, step.step FROM held, step WHERE octet_length(step.step::text) <= :limit
    ON CONFLICT (job_id) DO UPDATE SET steps = coalesce(r.steps, '{}') || excluded.steps
    WHERE NOT coalesce(r.steps ? :name::text, false)
      AND octet_length((coalesce(r.steps, '{}') || excluded.steps)::text) <= :limit
    RETURNING r.job_id
    """,
)

# Why RECORD_STEP changed nothing: the job's status and lease token (no row: no such job), and the result
# already recorded under the name (NULL: none) and how large its steps are now, as JSON text.
STEP_REFUSED = Query.define(
    "step_refused",
    """
    SELECT a.status, a.lease_token, r.steps -> :name::text AS recorded,
           coalesce(r.steps ? :name::text, false) AS taken,
           octet_length(coalesce(r.steps, '{}')::text) AS size
    FROM jobq.all_jobs a LEFT JOIN jobq.job_journal r ON r.job_id = a.id
    WHERE a.id = :id
    """,
)

# End a lease and park the job until an event (or make it pending at once with one sent before): one row,
# or none when the lease is not the job's current one.
AWAIT_EVENT = Query.define(
    "await_event",
    "SELECT * FROM jobq.await_event(:id, :queue, :lease_token, :event, :timeout)",
)

# Send an event: kept, and every job awaiting its name (in :scope) pending now. Its id, and how many woke.
SEND_EVENT = Query.define(
    "send_event",
    "SELECT * FROM jobq.send_event(:name, :payload::jsonb, :scope::text[])",
)

# Waits for an event that ran out: pending again, a `timed_out` entry appended to the job's events (so a
# handler replayed from the top knows that this wait is over, and found nothing), their queues woken.
# A bounded batch per statement; SKIP LOCKED passes over a job an event is waking at this moment.
EXPIRE_WAITS = Query.define(
    "expire_waits",
    f"""
    WITH due AS (
        SELECT id, wait_event FROM jobq.jobs
        WHERE status = 'waiting' AND wait_event IS NOT NULL AND run_at <= now()
        ORDER BY run_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ), woken AS (
        UPDATE jobq.jobs j
        SET status = 'pending', run_at = now(), updated_at = now(), wait_event = NULL, journaled = true,
            sleep_until = now()
        FROM due
        WHERE j.id = due.id AND j.status = 'waiting'
        RETURNING j.id, j.queue, j.key, j.run_at,
                  jsonb_build_array(jsonb_build_object(
                      'name', due.wait_event, 'payload', NULL, 'at', now(), 'timed_out', true)) AS entry
    ), journal AS (
        INSERT INTO jobq.job_journal AS r (job_id, events)
        SELECT id, entry FROM woken
        ON CONFLICT (job_id) DO UPDATE SET events = coalesce(r.events, '[]') || excluded.events
    ), {_notify("woken")}
    SELECT id, queue FROM woken WHERE {NOTIFIED}
    """,
)

# The journals of jobs gone (pruned with their queue's retention, purged, or their queue deleted), a bounded
# batch per statement. A job is looked up through the all_jobs view, which leaves out finished jobs past
# their purge_after: their journal goes with them.
PRUNE_JOURNALS = Query.define(
    "prune_journals",
    """
    DELETE FROM jobq.job_journal r USING (
        SELECT job_id FROM jobq.job_journal j
        WHERE NOT EXISTS (SELECT FROM jobq.all_jobs a WHERE a.id = j.job_id)
        LIMIT :batch
    ) gone
    WHERE r.job_id = gone.job_id
    """,
)

# Events past their retention (:kept seconds), a bounded batch per statement.
PRUNE_EVENTS = Query.define(
    "prune_events",
    """
    DELETE FROM jobq.events e USING (
        SELECT id FROM jobq.events WHERE at < now() - make_interval(secs => :kept) ORDER BY at LIMIT :batch
    ) old
    WHERE e.id = old.id
    """,
)

# The events kept, newest first, of one name or all (GET /events), those a token limited to some queues
# may see: sent by a token whose queues are among its own (an event of no scope reaches every queue, and
# only a token of every queue sees it).
LIST_EVENTS = Query.define(
    "list_events",
    """
    SELECT id, name, payload, at FROM jobq.events
    WHERE (:name::text IS NULL OR name = :name::text) AND id < :before_id
      AND (:scope::text[] IS NULL OR (scope IS NOT NULL AND scope <@ :scope::text[]))
    ORDER BY id DESC
    LIMIT :limit
    """,
)
