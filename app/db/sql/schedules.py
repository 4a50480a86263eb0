"""Schedules (app/service/schedules.py): their definitions, the scheduler's firings, each slot's job
enqueued once, and the leadership that keeps the scheduler on one replica.
"""

from __future__ import annotations

from app.db.sql.fragments import LOCKED, NOTIFIED, _in_scope, _notify, _queues_made
from app.db.sql.query import Query

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
