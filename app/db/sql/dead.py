"""Dead jobs: the dead-letter pages, retried, purged, and SQS's redrive into a dead-letter queue and
back (StartMessageMoveTask).
"""

from __future__ import annotations

from app.db.sql.fragments import JOB, LOCKED, NOTIFIED, _in_scope, _notify, _queues_made, dead_letter_target
from app.db.sql.query import Query

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

# SQS redrive: the dead jobs of each queue whose RedrivePolicy names another queue that exists
# (dead_letter_target in fragments.py) move into that queue, pending and receivable there as SQS moves a
# message past its maxReceiveCount into the dead-letter queue; each move is noted in sqs_dead_letters, so
# StartMessageMoveTask can take the message back to where it came from. A moved job starts over in its new
# queue: attempts 0, that queue's max_attempts, no dedup_key (the dead-letter queue deduplicates nothing of
# the source's); its key, payload, message attributes and last_error stay. Jobs enter the target as an
# enqueue does, under its queue lock (the queue row made again if a DeleteQueue just took it). A bounded
# batch, SKIP LOCKED: every replica may run it.
REDRIVE_DEAD = Query.define(
    "redrive_dead",
    f"""
    WITH policies AS (
        SELECT name AS source, {dead_letter_target("q")} AS target
        FROM jobq.queues q
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
