"""The end of a lease, each fenced by the lease token its holder was given: acked (completed), nacked
(pending again or dead), released, extended, revived (SQS), or expired; and SQS retention, which deletes
the messages of a receive under the lease it took. Where each leaves a job: app/core/states.py.
"""

from __future__ import annotations

from app.db.sql.fragments import _COMPLETED, KEY_FREED, NOTIFIED, TRACED, TRACED_OUT, _notify, _notify_done
from app.db.sql.query import Query

# Complete jobs whose latest lease token the caller holds, moving them to jobq.jobs_history. Accepted
# after the lease expired (lease expiry moved the job to pending or dead but kept the token), because the
# work was done; refused once anyone leased the job again (new token) or nack or dead retry cleared the
# token. Each item names its job by queue and id (the queue its lease token carries: app/service/rows.py),
# as do NACK, RELEASE and EXTEND.
# Each row back names the (id, token) that completed it: one statement may carry several items for one
# job (a batch, or acks of two workers coalesced), and only the item holding that token was done by it.
# :results holds each item's result as JSON text (NULL: none), or is NULL itself when no item has one,
# as most acks do: unnest pads it with NULLs, so an ack without results sends and parses nothing more.
# :deliveries likewise: the outcome of each job's push delivery (app/service/push.py) as JSON text, kept
# as its `delivery`; NULL for a worker's acks.
# A repeated ack finds the job completed (in jobs_history) and changes nothing, its result included.
ACK = Query.define(
    "ack",
    f"""
    WITH taken AS (
        DELETE FROM jobq.jobs j
        USING unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[], :results::text[],
                     :deliveries::text[])
              AS a(id, queue, lease_token, result, delivery)
        WHERE j.id = a.id AND j.queue = a.queue AND j.lease_token = a.lease_token
          AND j.status IN ('running', 'pending', 'dead')
        RETURNING j.*, a.result AS acked_result, a.delivery AS acked_delivery
    ), acked AS ({_COMPLETED}
        RETURNING j.id, j.lease_token, j.queue, j.key, j.run_at, {_notify_done()}, {TRACED}
    ), {_notify("acked", KEY_FREED)}
    SELECT id, lease_token, queue, done, {TRACED_OUT} FROM acked WHERE {NOTIFIED}
    """,
)

# The queue of each job (lease tokens issued before they named their queue: app/service/rows.py).
JOB_QUEUES = Query.define("job_queues", "SELECT id, queue FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])")

# Where an ack, nack or extend changed nothing: is the job unknown (404), already completed under this
# very token (a repeated ack, answered as success), or leased by someone else (409 lease_lost)?
LEASE_STATUS = Query.define(
    "lease_status",
    "SELECT id, status, lease_token FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])",
)

# Give jobs back after a failed attempt. Only the current holder of a running lease may.
# - dead=true, or no attempts left: the job goes dead and keeps its run_at.
# - otherwise pending again at now + retry_after, or the queue's backoff: base * 2^(attempts-1) with
#   0-30 % jitter against thundering herds, never more than the cap (the exponent is bounded so the
#   arithmetic cannot overflow).
# The token is cleared: this lease is over, and a late ack by the same worker must not complete a retry.
# As with ACK, each row back names the (id, token) that ended the lease (n.lease_token: the job's own is
# cleared by then), so only that item is answered as done; and :deliveries (NULL for a worker's nacks)
# keeps each push delivery's outcome.
NACK = Query.define(
    "nack",
    f"""
    WITH n AS (
        SELECT n.*, (n.dead OR j.attempts >= coalesce(j.max_attempts, q.max_attempts)) AS to_dead,
               least(q.backoff_cap,
                     q.backoff_base * power(2, least(j.attempts - 1, 60)) * (1 + 0.3 * random())) AS backoff
        FROM unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[], :errors::text[],
                    :retry_afters::float8[], :deads::bool[], :deliveries::text[])
             AS n(id, queue, lease_token, error, retry_after, dead, delivery)
        JOIN jobq.jobs j ON j.id = n.id AND j.queue = n.queue
        JOIN jobq.queues q ON q.name = j.queue
    ), nacked AS (
        UPDATE jobq.jobs j
        SET status = CASE WHEN n.to_dead THEN 'dead' ELSE 'pending' END,
            run_at = CASE WHEN n.to_dead THEN j.run_at
                          ELSE now() + make_interval(secs => coalesce(n.retry_after, n.backoff)) END,
            last_error = n.error, lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
            delivery = coalesce(n.delivery::jsonb, j.delivery)
        FROM n
        WHERE j.id = n.id AND j.queue = n.queue AND j.lease_token = n.lease_token AND j.status = 'running'
        RETURNING j.id, n.lease_token, j.queue, j.key, j.status, j.run_at,
                  {_notify_done(finished="n.to_dead")}, {TRACED}
    ), {_notify("nacked", f"status = 'pending' OR {KEY_FREED}")}
    SELECT id, lease_token, queue, status, run_at, {TRACED_OUT} FROM nacked WHERE {NOTIFIED}
    """,
)

# Hand back leased jobs without counting their attempt: jobs claimed for a long-poll whose client went
# away before they could be delivered, a worker's release, a push the endpoint asked to have again later
# (429 or 503 with Retry-After). Pending again at their place in line, or with :delays (NULL, or an item's
# NULL or 0: none) at now + that many seconds, asleep (a sleep's end, kept as sleep_until, marks a job as
# begun: it holds an in-order key, sql.fragments.KEY_HOLDER, and a release without a delay keeps it);
# :deliveries keeps a push delivery's outcome, as NACK's does.
# Each row back names the (id, token) that released it, as with ACK.
RELEASE = Query.define(
    "release",
    f"""
    WITH released AS (
        UPDATE jobq.jobs j
        SET status = 'pending', attempts = j.attempts - 1, lease_token = NULL, lease_expires_at = NULL,
            worker_id = NULL, updated_at = now(),
            run_at = CASE WHEN coalesce(r.delay, 0) = 0 THEN j.run_at
                          ELSE now() + make_interval(secs => r.delay) END,
            sleep_until = CASE WHEN r.delay > 0 THEN now() + make_interval(secs => r.delay)
                               ELSE j.sleep_until END,
            delivery = coalesce(r.delivery::jsonb, j.delivery)
        FROM unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[], :delays::float8[],
                    :deliveries::text[]) AS r(id, queue, lease_token, delay, delivery)
        WHERE j.id = r.id AND j.queue = r.queue AND j.lease_token = r.lease_token AND j.status = 'running'
        RETURNING j.id, r.lease_token, j.queue, j.run_at
    ), {_notify("released")}
    SELECT id, lease_token, queue FROM released WHERE {NOTIFIED}
    """,
)

# Move a running lease's deadline to now + :visibility_timeout; only its holder may. With :progress (JSON
# text) it replaces the job's progress; NULL keeps the last one.
EXTEND = Query.define(
    "extend",
    """
    UPDATE jobq.jobs
    SET lease_expires_at = now() + make_interval(secs => :visibility_timeout), updated_at = now(),
        progress = coalesce(:progress::jsonb, progress)
    WHERE id = :id AND queue = :queue AND lease_token = :lease_token AND status = 'running'
    RETURNING id, lease_expires_at
    """,
)

# SQS ChangeMessageVisibility by the last receive of a message whose visibility ran out, nobody having
# received it since: in flight again under the same receipt handle, as SQS allows (jobq's own EXTEND does
# not). The expiry counted that receive's attempt already; this counts none. Jobs with a key stay pending:
# running again outside the claim could pass their key's limits.
REVIVE_LEASE = Query.define(
    "revive_lease",
    """
    UPDATE jobq.jobs
    SET status = 'running', lease_expires_at = now() + make_interval(secs => :visibility_timeout),
        updated_at = now()
    WHERE id = :id AND queue = :queue AND lease_token = :lease_token AND status = 'pending' AND key IS NULL
    RETURNING id, lease_expires_at
    """,
)

# Lease expiry: running jobs past their deadline count a failed attempt and become leasable again at once
# (pending, keeping their place in line), or dead when out of attempts. SKIP LOCKED and the status check
# make it safe in every replica at once; the token stays so the late holder may still ack. The queue :queue
# only (an SQS receive's, which must see its own queue's messages visible), or every queue (NULL: the loop).
EXPIRE_LEASES = Query.define(
    "expire_leases",
    f"""
    WITH expired AS (
        SELECT id FROM jobq.jobs
        WHERE status = 'running' AND lease_expires_at <= now() AND (:queue::text IS NULL OR queue = :queue)
        ORDER BY lease_expires_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ), returned AS (
        UPDATE jobq.jobs j
        SET status = CASE WHEN j.attempts >= coalesce(j.max_attempts, q.max_attempts)
                          THEN 'dead' ELSE 'pending' END,
            last_error = format('lease expired at %s on attempt %s (worker %s)',
                                to_char(j.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                                j.attempts, coalesce(j.worker_id, 'unnamed')),
            lease_expires_at = NULL, updated_at = now()
        FROM expired, jobq.queues q
        WHERE j.id = expired.id AND q.name = j.queue
        RETURNING j.id, j.queue, j.key, j.status, j.run_at, {_notify_done(finished="j.status = 'dead'")},
                  {TRACED}
    ), {_notify("returned", f"status = 'pending' OR {KEY_FREED}")}
    SELECT id, queue, status, {TRACED_OUT} FROM returned WHERE {NOTIFIED}
    """,
)

# SQS MessageRetentionPeriod: messages a receive leased and found sent more than :retention seconds ago,
# deleted as SQS deletes them, each fenced by the lease that receive took (app/service/sqs_messages.py).
# A key's slot freed this way wakes the queue's long-polls, as an ack's does.
EXPIRE_MESSAGES = Query.define(
    "expire_messages",
    f"""
    WITH gone AS (
        DELETE FROM jobq.jobs j
        USING unnest(:ids::bigint[], :queues::text[], :lease_tokens::uuid[]) AS r(id, queue, lease_token)
        WHERE j.id = r.id AND j.queue = r.queue AND j.lease_token = r.lease_token AND j.status = 'running'
          AND j.created_at <= now() - make_interval(secs => :retention)
        RETURNING j.id, j.queue, j.key, j.run_at, {_notify_done()}
    ), {_notify("gone", KEY_FREED)}
    SELECT id FROM gone WHERE {NOTIFIED}
    """,
)
