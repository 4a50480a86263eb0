"""Push delivery (app/service/push.py): a queue's push target and signing secrets, the gate each claim of
deliveries passes (how many of the queue's jobs run, what is held), and the holds an endpoint's 429 or
503 with Retry-After puts on a key or a whole queue. The deliveries' claims are the workers' (claim.py)
and their ends too (ends.py: ACK, NACK and RELEASE keep each delivery's outcome).
"""

from __future__ import annotations

import zlib

from app.db.sql.fragments import CHANNEL, QUEUE_LOCK_CLASS
from app.db.sql.query import Query

# The claims of one queue's deliveries, on every replica, take turns under a transaction-scoped advisory
# lock of their own class (the two-key form, as the queue locks of enqueues: app/db/sql/fragments.py):
# each counts the queue's running jobs and claims at most what its `concurrency` leaves, and commits
# before the next one counts.
PUSH_LOCK_CLASS = QUEUE_LOCK_CLASS + 1


def push_lock(queue: str) -> str:
    """The queue's push lock, as a statement without parameters (it begins the claim's transaction in
    the same round trip: app/db/pool.py transaction_with); the lock's second key is the name's CRC-32, the
    same on every replica, written in as an integer (no text from outside)."""
    key = zlib.crc32(queue.encode()) - 2**31
    return f"SELECT pg_advisory_xact_lock({PUSH_LOCK_CLASS}, {key})"


# Every replica reads a queue's target again when it changes: the notification SET_FLOW sends too.
_SETTINGS_CHANGED = f"""pg_notify('{CHANNEL}', json_build_object(
        'queue', name, 'n', {2**31 - 1}, 'run_at', extract(epoch FROM now()), 'settings', true)::text)"""

# The queues with a push target, and what signs their requests: the secret, and the one it replaced
# while that is still valid (NULL otherwise). Paused queues too: their deliveries wait as workers do.
PUSH_TARGETS = Query.define(
    "push_targets",
    """
    SELECT name AS queue, push, push_secret,
           CASE WHEN push_secret_previous_until > now() THEN push_secret_previous END AS push_secret_previous
    FROM jobq.queues
    WHERE push IS NOT NULL
    """,
)

# Set a queue's push target (:push, JSON) or clear it (NULL), creating the queue if need be; a queue
# given its first target gets :secret as its signing secret (`made`: the caller answers it, once).
SET_PUSH = Query.define(
    "set_push",
    f"""
    WITH changed AS (
        INSERT INTO jobq.queues AS q (name, push, push_secret)
        VALUES (:queue, :push::jsonb, CASE WHEN :push::jsonb IS NOT NULL THEN :secret END)
        ON CONFLICT (name) DO UPDATE SET
            push = :push::jsonb,
            push_secret = CASE WHEN q.push_secret IS NULL AND :push::jsonb IS NOT NULL THEN :secret
                               ELSE q.push_secret END,
            updated_at = now()
        RETURNING name, push_secret = :secret AS made
    )
    SELECT made, {_SETTINGS_CHANGED} FROM changed
    """,
)

# A new signing secret for the queue (made if need be); the one it replaces stays valid for :overlap
# seconds, so that receivers can be given the new one meanwhile.
ROTATE_PUSH_SECRET = Query.define(
    "rotate_push_secret",
    f"""
    WITH changed AS (
        INSERT INTO jobq.queues AS q (name, push_secret) VALUES (:queue, :secret)
        ON CONFLICT (name) DO UPDATE SET
            push_secret_previous = q.push_secret,
            push_secret_previous_until = CASE WHEN q.push_secret IS NOT NULL
                                              THEN now() + make_interval(secs => :overlap) END,
            push_secret = :secret,
            updated_at = now()
        RETURNING name
    )
    SELECT {_SETTINGS_CHANGED} FROM changed
    """,
)

# The worker id of every delivery's lease starts with it (app/service/push.py worker_id).
PUSH_WORKER_PREFIX = "push:"

# Run once the queue's push lock (PUSH_LOCK) is held, in the same transaction as the claim after it: the
# queue's deliveries in flight on every replica (a slot of its `concurrency` is a live delivery lease, as
# a key's slot is a running job: whatever ends the lease frees it, its expiry too; ix_jobs_pushing holds
# exactly these rows), seconds its deliveries are held for (NULL: none), its keys held now with the
# seconds each is held for, and its push URL now (NULL: no longer pushed), read in the claim's own
# transaction: a replica's targets may lag a PATCH that a job enqueued since followed.
PUSH_GATE = Query.define(
    "push_gate",
    f"""
    SELECT (SELECT count(*) FROM jobq.jobs
            WHERE queue = :queue AND status = 'running' AND worker_id LIKE '{PUSH_WORKER_PREFIX}%')
           AS running,
           (SELECT extract(epoch FROM push_held_until - now())::float8 FROM jobq.queues
            WHERE name = :queue AND push_held_until > now()) AS held_for,
           (SELECT push->>'url' FROM jobq.queues WHERE name = :queue) AS url,
           h.held_keys, h.held_key_seconds
    FROM (SELECT coalesce(array_agg(key), '{{}}') AS held_keys,
                 coalesce(array_agg(extract(epoch FROM until - now())::float8), '{{}}') AS held_key_seconds
          FROM jobq.push_holds WHERE queue = :queue AND until > now()) h
    """,
)

# Hold a key's deliveries (:key) or, with :key NULL, the whole queue's, for :seconds from now (a longer
# hold already in place stays).
HOLD_PUSH = Query.define(
    "hold_push",
    """
    WITH queue_held AS (
        UPDATE jobq.queues
        SET push_held_until = greatest(push_held_until, now() + make_interval(secs => :seconds))
        WHERE name = :queue AND :key::text IS NULL
    )
    INSERT INTO jobq.push_holds AS h (queue, key, until)
    SELECT :queue, :key::text, now() + make_interval(secs => :seconds) WHERE :key::text IS NOT NULL
    ON CONFLICT (queue, key) DO UPDATE SET until = greatest(h.until, excluded.until)
    """,
)

# Holds that are over.
PRUNE_PUSH_HOLDS = Query.define("prune_push_holds", "DELETE FROM jobq.push_holds WHERE until <= now()")
