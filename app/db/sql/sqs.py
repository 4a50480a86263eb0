"""The statements only the SQS API needs, none of which changes a job's status: those (PurgeQueue's,
DeleteQueue's, redrive's, retention's) are with the others of their topic in this package, where
app/core/states.py names them. Everything else goes through ``app.service``.

Same conventions as the rest of the package: named parameters, one purpose each. The package does not
re-export these: ``from app.db.sql import sqs as sq``.
"""

from __future__ import annotations

from app.db.sql.fragments import LEASED_JOB, dead_letter_target
from app.db.sql.query import Query

# A queue as SQS shows it: jobq's settings, the attributes SQS set, when it was made and changed, and the
# queue its RedrivePolicy moves dead letters into (NULL: none).
_QUEUE = f"""
    SELECT name, visibility_timeout, max_attempts, coalesce(sqs_attributes, '{{}}') AS sqs_attributes,
           created_at, updated_at, {dead_letter_target("q")} AS dead_letter_queue
    FROM jobq.queues q WHERE name = :queue"""
QUEUE = Query.define("sqs_queue", _QUEUE)

# Queue names in order, from just after :after, for ListQueues' pages: those starting with :prefix and with
# none of :others (a region's queues: app/sqs/regions.py), matching the key's queue patterns (:scope, LIKE
# patterns as _in_scope in fragments.py takes them; NULL for every queue).
LIST_QUEUES = Query.define(
    "sqs_list_queues",
    """
    SELECT name FROM jobq.queues
    WHERE starts_with(name, :prefix) AND name > :after
      AND NOT EXISTS (SELECT FROM unnest(:others::text[]) AS o(prefix) WHERE starts_with(name, o.prefix))
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

# A queue's tags and its kept attributes, its row locked to the end of the transaction: TagQueue and
# AddPermission read, change and write them back, and two at once must not lose one's change.
QUEUE_META_FOR_UPDATE = Query.define(
    "sqs_queue_meta_for_update",
    """
    SELECT coalesce(sqs_tags, '{}') AS sqs_tags, coalesce(sqs_attributes, '{}') AS sqs_attributes
    FROM jobq.queues WHERE name = :queue
    FOR UPDATE
    """,
)

# A queue's tags, replaced (NULL: none). Tags are not attributes: LastModifiedTimestamp stays.
SET_SQS_TAGS = Query.define(
    "sqs_set_tags",
    """
    UPDATE jobq.queues SET sqs_tags = nullif(:tags::jsonb, '{}') WHERE name = :queue
    """,
)

# A queue's tags ('{}': none); no row: no such queue.
QUEUE_TAGS = Query.define(
    "sqs_queue_tags",
    """
    SELECT coalesce(sqs_tags, '{}') AS sqs_tags FROM jobq.queues WHERE name = :queue
    """,
)

# SQS keeps a queue's name for a minute after DeleteQueue (QueueDeletedRecently), and takes one
# PurgeQueue a minute (PurgeQueueInProgress), on every replica: both remembered here.
SQS_NAME_HOLD = 60  # seconds

# Note a queue as just deleted (in DeleteQueue's transaction), forgetting those deleted long enough ago.
NOTE_DELETED_QUEUE = Query.define(
    "sqs_note_deleted_queue",
    f"""
    WITH forgotten AS (
        DELETE FROM jobq.sqs_deleted_queues WHERE deleted_at <= now() - interval '{SQS_NAME_HOLD} seconds'
    )
    INSERT INTO jobq.sqs_deleted_queues (name) VALUES (:queue)
    ON CONFLICT (name) DO UPDATE SET deleted_at = now()
    """,
)

# Whether a queue of this name was deleted within the last minute.
DELETED_RECENTLY = Query.define(
    "sqs_deleted_recently",
    f"""
    SELECT EXISTS (
        SELECT 1 FROM jobq.sqs_deleted_queues
        WHERE name = :queue AND deleted_at > now() - interval '{SQS_NAME_HOLD} seconds'
    )
    """,
)

# Take the queue's purge turn: a row when no SQS PurgeQueue ran in the last minute (and it is now noted).
TAKE_PURGE_TURN = Query.define(
    "sqs_take_purge_turn",
    f"""
    UPDATE jobq.queues SET sqs_purged_at = now()
    WHERE name = :queue
      AND (sqs_purged_at IS NULL OR sqs_purged_at <= now() - interval '{SQS_NAME_HOLD} seconds')
    RETURNING name
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


# What a receive must do before it leases (app/service/sqs_messages.py expire_overdue): whether one of the
# queue's leases has run out (`overdue`: the message is visible to SQS, though the lease-expiry loop has
# not returned it yet), the seconds until the next one runs out (`due_in`, NULL when none does within
# :within seconds: a long-poll waits no longer than that), and whether the queue holds dead jobs that its
# dead-letter queue `dlq` (NULL: none) is there to take. Both leases are read through ix_jobs_lease_expiry,
# which holds running jobs alone, in deadline order: only those that end by now + :within are read,
# whichever queue holds them, never the queue's whole backlog.
def _receive_due(dlq: str) -> str:
    return f"""
    EXISTS (SELECT FROM jobq.jobs
            WHERE status = 'running' AND lease_expires_at <= now() AND queue = :queue) AS overdue,
    (SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM jobq.jobs
     WHERE status = 'running' AND lease_expires_at > now()
       AND lease_expires_at <= now() + make_interval(secs => :within) AND queue = :queue
     ORDER BY lease_expires_at
     LIMIT 1) AS due_in,
    {dlq} IS NOT NULL AND {dlq} <> :queue
    AND EXISTS (SELECT FROM jobq.queues WHERE name = {dlq})
    AND EXISTS (SELECT FROM jobq.jobs WHERE queue = :queue AND status = 'dead') AS dead"""


# What a receive's long-poll reads again each time it looks (:dlq: the queue's dead-letter queue).
RECEIVE_DUE = Query.define("sqs_receive_due", f"SELECT {_receive_due(':dlq::text')}")

# The queue as QUEUE reads it and what a receive must do before it leases, in one statement: a receive's
# first look at the queue costs no round trip of its own.
RECEIVING_QUEUE = Query.define(
    "sqs_receiving_queue",
    f"""
    WITH q AS ({_QUEUE})
    SELECT q.*, {_receive_due("q.dead_letter_queue")}
    FROM q
    """,
)

# A queue's messages as GetQueueAttributes counts them (ApproximateNumberOfMessages, ...NotVisible,
# ...Delayed), named as QUEUE_STATS names jobq's own counts: a running job whose lease has run out is
# visible (`pending`), as it is to a receive, though the lease-expiry loop has not returned it yet. Only
# the statuses SQS counts are read, none of jobq.jobs_history.
SQS_COUNTS = Query.define(
    "sqs_counts",
    """
    SELECT count(*) FILTER (WHERE status = 'pending' AND run_at <= now()
                               OR status = 'running' AND lease_expires_at <= now()) AS pending,
           count(*) FILTER (WHERE status = 'running' AND lease_expires_at > now()) AS running,
           count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled
    FROM jobq.jobs
    WHERE queue = :queue AND status IN ('pending', 'running')
    """,
)

# The queues whose RedrivePolicy names the queue :dlq as their dead-letter queue.
DEAD_LETTER_SOURCES = Query.define(
    "sqs_dead_letter_sources",
    f"""
    SELECT name FROM jobq.queues q
    WHERE {dead_letter_target("q")} = :dlq
    ORDER BY name
    """,
)

# --- FIFO queues (app/service/sqs_fifo.py) ---------------------------------------------------------

# Keep the deduplication ids of FIFO messages just enqueued, in the enqueue's own transaction, as
# idempotency keys (scope: the queue, or the queue and message group), each answering with its job for
# :interval seconds. A key already there fails the statement on pk_idempotency_keys, which rolls the
# messages back; in key order, so two sends waiting on each other's keys cannot deadlock.
KEEP_DEDUPLICATION_IDS = Query.define(
    "sqs_keep_deduplication_ids",
    """
    INSERT INTO jobq.idempotency_keys (scope, key, request_hash, ids, max_attempts, created_at, expires_at)
    SELECT scope, key, body_hash, ARRAY[id], '{}', now(), now() + make_interval(secs => :interval)
    FROM unnest(:scopes::text[], :keys::text[], :body_hashes::bytea[], :ids::bigint[])
         AS k(scope, key, body_hash, id)
    ORDER BY scope, key
    """,
)

# The messages a receive attempt leased that are still in flight under the same leases (not deleted, not
# made visible, not expired), their visibility timeout started again (:visibility_timeout, NULL: the
# queue's), as SQS does for a retried receive. Running jobs stay running: no status changes.
REPLAY_RECEIVE = Query.define(
    "sqs_replay_receive",
    f"""
    WITH held AS (
        SELECT h.id, h.lease_token, h.ord
        FROM jobq.sqs_receive_attempts a,
             unnest(a.ids, a.lease_tokens) WITH ORDINALITY AS h(id, lease_token, ord)
        WHERE a.queue = :queue AND a.attempt_id = :attempt_id AND a.expires_at > now()
    )
    UPDATE jobq.jobs j
    SET lease_expires_at = now()
            + make_interval(secs => coalesce(:visibility_timeout::float8, q.visibility_timeout)),
        updated_at = now()
    FROM held, jobq.queues q
    WHERE j.id = held.id AND j.queue = :queue AND j.lease_token = held.lease_token AND j.status = 'running'
      AND q.name = j.queue
    RETURNING {LEASED_JOB}, held.ord
    """,
)

# Keep what a receive attempt leased, for :interval seconds; no row back when the attempt id is kept
# already (waiting for a receive that is keeping it to commit).
KEEP_RECEIVE_ATTEMPT = Query.define(
    "sqs_keep_receive_attempt",
    """
    INSERT INTO jobq.sqs_receive_attempts (queue, attempt_id, ids, lease_tokens, created_at, expires_at)
    VALUES (:queue, :attempt_id, :ids::bigint[], :lease_tokens::uuid[], now(),
            now() + make_interval(secs => :interval))
    ON CONFLICT (queue, attempt_id) DO NOTHING
    RETURNING attempt_id
    """,
)

# The attempt id's row, locked to the end of the transaction, so that REPLACE_RECEIVE_ATTEMPT, whose
# snapshot begins once the lock is held, sees the leases of the receive that kept it.
LOCK_RECEIVE_ATTEMPT = Query.define(
    "sqs_lock_receive_attempt",
    """
    SELECT attempt_id FROM jobq.sqs_receive_attempts
    WHERE queue = :queue AND attempt_id = :attempt_id
    FOR UPDATE
    """,
)

# Keep what a receive leased under an attempt id kept already, if that attempt is spent: expired, or none
# of its messages still in flight under its leases. No row back otherwise: another receive with the same
# attempt id got in first, and its messages are the answer.
REPLACE_RECEIVE_ATTEMPT = Query.define(
    "sqs_replace_receive_attempt",
    """
    UPDATE jobq.sqs_receive_attempts a
    SET ids = :ids::bigint[], lease_tokens = :lease_tokens::uuid[], created_at = now(),
        expires_at = now() + make_interval(secs => :interval)
    WHERE a.queue = :queue AND a.attempt_id = :attempt_id
      AND (a.expires_at <= now()
           OR NOT EXISTS (SELECT FROM unnest(a.ids, a.lease_tokens) AS h(id, lease_token)
                          JOIN jobq.jobs j ON j.id = h.id AND j.queue = a.queue
                                          AND j.lease_token = h.lease_token AND j.status = 'running'))
    RETURNING attempt_id
    """,
)

# Forget receive attempts past their expires_at, a bounded batch per statement (as PRUNE_IDEMPOTENCY_KEYS).
PRUNE_RECEIVE_ATTEMPTS = Query.define(
    "sqs_prune_receive_attempts",
    """
    WITH doomed AS (
        SELECT queue, attempt_id FROM jobq.sqs_receive_attempts
        WHERE expires_at <= now()
        ORDER BY expires_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobq.sqs_receive_attempts a USING doomed
    WHERE a.queue = doomed.queue AND a.attempt_id = doomed.attempt_id
    """,
)


# Forget a FIFO queue's deduplication ids (app/service/sqs_fifo.py keeps them as idempotency keys), those
# of DeduplicationScope queue (:scope) and of messageGroup (scopes starting with :group_prefix) alike,
# so that after a purge a message sent again under an id is a new message, as in SQS. starts_with takes
# no index under a collation other than C, so the messageGroup ids are found by a scan of
# jobq.idempotency_keys: a purge runs at most once a minute per queue, and the table holds only the keys
# of the last few minutes (JOBQ_IDEMPOTENCY_TTL, SQS's five minutes).
FORGET_DEDUPLICATION_IDS = Query.define(
    "sqs_forget_deduplication_ids",
    """
    DELETE FROM jobq.idempotency_keys
    WHERE scope = :scope OR starts_with(scope, :group_prefix)
    """,
)
