"""The statements only the SQS API needs; everything else goes through ``app.jobs`` and ``app.queries``.

Same conventions as ``app/queries.py``: named parameters, one purpose each.
"""

from __future__ import annotations

from app.queries import QUEUE_LOCK_CLASS, Query

# A queue as SQS shows it: jobq's settings, the attributes SQS set, and when it was made and changed.
QUEUE = Query.define(
    "sqs_queue",
    """
    SELECT name, visibility_timeout, max_attempts, coalesce(sqs_attributes, '{}') AS sqs_attributes,
           created_at, updated_at
    FROM jobq.queues WHERE name = :queue
    """,
)

# Queue names in order, from just after :after, for ListQueues' pages; only those matching the key's
# queue patterns (:scope, LIKE patterns as in app/queries.py; NULL for every queue).
LIST_QUEUES = Query.define(
    "sqs_list_queues",
    """
    SELECT name FROM jobq.queues
    WHERE starts_with(name, :prefix) AND name > :after
      AND (:scope::text[] IS NULL OR name LIKE ANY(:scope::text[]))
    ORDER BY name
    LIMIT :limit
    """,
)

# Merge attributes into a queue's SQS attributes and drop the :removed ones.
SET_SQS_ATTRIBUTES = Query.define(
    "sqs_set_attributes",
    """
    UPDATE jobq.queues
    SET sqs_attributes = (coalesce(sqs_attributes, '{}') || :attributes::jsonb) - :removed::text[],
        updated_at = now()
    WHERE name = :queue
    """,
)

# Store the message attributes of messages just enqueued (in the enqueue's own transaction).
SET_MESSAGE_ATTRIBUTES = Query.define(
    "sqs_set_message_attributes",
    """
    UPDATE jobq.jobs j SET message_attributes = a.attributes::jsonb
    FROM unnest(:ids::bigint[], :attributes::text[]) AS a(id, attributes)
    WHERE j.id = a.id
    """,
)

# What a receive answers beside the leased job: its message attributes, and its first receive, which
# is marked now for jobs handed out for the first time (only those rows are written).
RECEIVED = Query.define(
    "sqs_received",
    """
    WITH marked AS (
        UPDATE jobq.jobs SET first_received_at = now()
        WHERE id = ANY(:ids::bigint[]) AND first_received_at IS NULL
        RETURNING id, first_received_at
    )
    SELECT j.id, j.message_attributes, coalesce(m.first_received_at, j.first_received_at) AS first_received_at
    FROM jobq.jobs j LEFT JOIN marked m ON m.id = j.id
    WHERE j.id = ANY(:ids::bigint[])
    """,
)

# PurgeQueue: every message of the queue, visible or in flight; dead ones stay (they are the queue's
# dead letters, which SQS would keep in another queue).
PURGE = Query.define(
    "sqs_purge",
    "DELETE FROM jobq.jobs WHERE queue = :queue AND status IN ('pending', 'running')",
)

# DeleteQueue, first: the queue's lock, exclusively (app/queries.py QUEUE_LOCK_CLASS), in a statement of
# its own, in DELETE_QUEUE's transaction. It waits for every enqueue into the queue in flight, an
# application's open transaction that called jobq.enqueue() included; DELETE_QUEUE, which starts after,
# sees their jobs and deletes them too. An enqueue arriving meanwhile waits for the delete to commit,
# then creates the queue row again with its job. So no job outlives its queue row.
LOCK_QUEUE = Query.define(
    "sqs_lock_queue",
    f"SELECT pg_advisory_xact_lock({QUEUE_LOCK_CLASS}, hashtext(:queue))",
)

# DeleteQueue: the queue and every job it holds, in any state (after LOCK_QUEUE).
DELETE_QUEUE = Query.define(
    "sqs_delete_queue",
    """
    WITH gone AS (DELETE FROM jobq.jobs WHERE queue = :queue)
    DELETE FROM jobq.queues WHERE name = :queue RETURNING name
    """,
)

# The queues whose RedrivePolicy names :arn as their dead-letter target.
DEAD_LETTER_SOURCES = Query.define(
    "sqs_dead_letter_sources",
    """
    SELECT name FROM jobq.queues
    WHERE (sqs_attributes ->> 'RedrivePolicy')::jsonb ->> 'deadLetterTargetArn' = :arn
    ORDER BY name
    """,
)

# Dead jobs per queue: what a move task would move.
DEAD_COUNTS = Query.define(
    "sqs_dead_counts",
    """
    SELECT count(*) FROM jobq.jobs WHERE status = 'dead' AND queue = ANY(:queues::text[])
    """,
)
