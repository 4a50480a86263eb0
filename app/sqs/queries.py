"""The statements only the SQS API needs, none of which changes a job's status (those, PurgeQueue's and
DeleteQueue's included, are in ``app/queries.py`` with the state machine); everything else goes through
``app.jobs``.

Same conventions as ``app/queries.py``: named parameters, one purpose each.
"""

from __future__ import annotations

from app.queries import Query

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

# The queues whose RedrivePolicy names :arn as their dead-letter target.
DEAD_LETTER_SOURCES = Query.define(
    "sqs_dead_letter_sources",
    """
    SELECT name FROM jobq.queues
    WHERE (sqs_attributes ->> 'RedrivePolicy')::jsonb ->> 'deadLetterTargetArn' = :arn
    ORDER BY name
    """,
)
