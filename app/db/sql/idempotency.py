"""Idempotency keys: the enqueues that keep their answer under a key in the same statement, the kept
answers read back, and keys pruned once expired.
"""

from __future__ import annotations

from app.core.limits import DEFAULT_MAX_ATTEMPTS
from app.db.sql.enqueue import _ENQUEUE_NEW_CTES, _NEW_JOBS_ROW
from app.db.sql.fragments import NOTIFIED
from app.db.sql.query import Query

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

# An Idempotency-Key sent with POST /workflows, or with an enqueue of jobs with parents or debounce, whose
# answers the request cannot rebuild (app/service/idempotency.py, claim): claimed in the transaction that
# makes the jobs, before anything else, so a second request under the key waits for the first to commit
# and then finds it; the answer is kept whole once made, with the ids it made. A key past its expires_at
# that pruning has not reached yet is freed (FREE_EXPIRED_KEY) and claimed again.
CLAIM_KEY = Query.define(
    "claim_key",
    """
    INSERT INTO jobq.idempotency_keys (scope, key, request_hash, ids, max_attempts, expires_at)
    VALUES (:scope, :key, :request_hash, '{}', '{}', now() + make_interval(secs => :ttl))
    ON CONFLICT DO NOTHING
    RETURNING key
    """,
)
KEPT_KEY = Query.define(
    "kept_key",
    """
    SELECT request_hash, answer, expires_at > now() AS live FROM jobq.idempotency_keys
    WHERE scope = :scope AND key = :key
    """,
)
FREE_EXPIRED_KEY = Query.define(
    "free_expired_key",
    "DELETE FROM jobq.idempotency_keys WHERE scope = :scope AND key = :key AND expires_at <= now()",
)
KEEP_ANSWER = Query.define(
    "keep_answer",
    """
    UPDATE jobq.idempotency_keys SET answer = :answer, ids = :ids::bigint[]
    WHERE scope = :scope AND key = :key
    """,
)
