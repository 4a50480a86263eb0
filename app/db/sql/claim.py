"""Claims: ready jobs leased to workers, pending to running (app/core/states.py). LEASE claims a queue
without flow control; a queue under flow control is claimed by FLOW_KEYS then LEASE_FLOW (or
LEASE_FLOW_RATED), or from its front by LEASE_FLOW_FRONT (app/service/flow.py chooses).
"""

from __future__ import annotations

from app.db.sql.fragments import KEY_HOLDER, LEASED_JOB, WINDOW_CLOCK, _used
from app.db.sql.query import Query

# Claim ready jobs in one statement, so nothing can run between choosing and marking; one statement serves
# several lease calls on the same queue at once (app/service/coalesce.py). Each call owns a run of slots:
# :visibility_timeouts and :worker_ids hold one entry per slot, and the n-th job in lease order fills slot n,
# so each call gets its share in order and its own lease settings.
# - `q`: the queue's settings, and no row at all when it is paused (or unknown), or under flow control
#   (claimed by LEASE_FLOW instead): then nothing is claimed.
# - `ready`: walks ix_jobs_claim in lease order; SKIP LOCKED passes over rows another claim holds instead of
#   waiting for it, so concurrent statements get different jobs and never block each other. Order is
#   therefore best effort under concurrency.
# - the UPDATE marks them running, counts the attempt and fences each lease with a fresh token and a
#   deadline on the database clock; a debounced job's debounce ends (`debounce_key` NULL: an enqueue of its
#   key makes a new job from now on, which the job, back to pending after a failed attempt, must not meet
#   in uq_jobs_debounce). It reads each slot's settings by subscript, never by joining the
#   arrays as rows: with statistics from a nearly empty table the planner took such a join for one row
#   and rescanned it per job (quadratic: 18 ms instead of 2 for a claim of 216 jobs).
# - the jobs found by the scan of their queue are looked up again by id alone, through the primary key:
#   a unique index on id is what keeps those lookups one row each, whatever the statistics say. On
#   statistics taken while the table was nearly empty (a burst into a new queue, before autovacuum's
#   next ANALYZE), naming the queue there too let the planner walk the queue's claim index per job
#   instead (LEASE_FLOW: 12 ms against 2.7 for 100 jobs); with the primary key on (queue, id) and only a
#   plain index on id, it hashed the whole table even without the queue named (LEASE_FLOW: 480 ms; the
#   plain LEASE with it named: 250 ms against 1.3). So jobs keeps its key on id on one server, and
#   uq_jobs_queue_id is the key a table distributed by queue would have (README: Scaling out).
LEASE = Query.define(
    "lease",
    f"""
    WITH q AS (
        SELECT max_attempts, visibility_timeout FROM jobq.queues
        WHERE name = :queue AND NOT paused AND NOT flow
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY priority, run_at, id) AS slot
        FROM (
            SELECT id, priority, run_at FROM jobq.jobs
            WHERE queue = :queue AND status = 'pending' AND run_at <= now() AND EXISTS (SELECT FROM q)
            ORDER BY priority, run_at, id
            LIMIT cardinality(:worker_ids::text[])
            FOR UPDATE SKIP LOCKED
        ) locked
    )
    UPDATE jobq.jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(
            secs => coalesce((:visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
        worker_id = (:worker_ids::text[])[ready.slot], updated_at = now(), debounce_key = NULL
    FROM ready, q
    WHERE j.id = ready.id
    RETURNING {LEASED_JOB}, ready.slot
    """,
)

# --- flow control (app/service/flow.py) ----------------------------------------------------------------
# A queue with flow control (`queues.flow`: key_concurrency, fair, rate, key_rate, or a key's override)
# is claimed in one short transaction of two statements instead of LEASE: LEASE_FLOW_FRONT (the same two
# steps in one function) for a queue under key concurrency alone, while the front of the queue has room
# (below); otherwise FLOW_KEYS then LEASE_FLOW:
# - FLOW_KEYS walks the keys that have pending jobs, one after the other from where this replica's last
#   claim stopped (round robin; a `fair` queue's claims from the key after the one the queue's last claim
#   served, on any replica), and takes a transaction-scoped advisory lock on each key it will claim
#   from (try-lock: a key another claim holds is passed over, as SKIP LOCKED passes over rows). A queue
#   with a rate locks its row too, so claims of it take turns.
# - LEASE_FLOW runs after the locks are held, so its snapshot (a statement's own, in READ COMMITTED)
#   sees every claim, ack and expiry that committed under them: the running jobs it counts per key are
#   the true count, and no other claim can add to it before this one commits. Nothing is kept per key
#   but what the jobs table says (a slot is a running job), so whatever ends a lease (ack, nack, expiry,
#   release, a late ack of an expired lease) frees its slot exactly once, by changing the job's status.
#   Rate windows are the exception: they are kept (keys.rate_times, queues.rate_times) and written by
#   the claim that holds the lock.
# Jobs without a key are not limited by key; they are taken from the front of the queue.

# A key's advisory lock: one bigint from the queue and the key.
_KEY_LOCK = "pg_try_advisory_xact_lock(hashtextextended({key}, hashtext(:queue)))"


def _keys_with_pending(after: str) -> str:
    """The first key of the queue's pending jobs after `after` (NULL: none), through ix_jobs_key_ready.
    ORDER BY ... LIMIT 1 rather than min(): on statistics that take the table for nearly empty, min()
    was planned as an aggregate over every later key's jobs."""
    return f"""(SELECT key FROM jobq.jobs
                WHERE queue = :queue AND status = 'pending' AND key IS NOT NULL AND key > {after}
                ORDER BY key LIMIT 1)"""


# A rate window (`rate_times`, `rate_counts` and `rate_period` of the row `source`) without the claims
# that have left it, to which a claim then adds its own: `times`, `counts`.
def _window(source: str) -> str:
    return f"""(
            SELECT coalesce(array_agg(t ORDER BY t), '{{}}') AS times,
                   coalesce(array_agg(c ORDER BY t), '{{}}') AS counts
            FROM unnest({source}.rate_times, {source}.rate_counts) AS w(t, c)
            WHERE t > {WINDOW_CLOCK} - make_interval(secs => {source}.rate_period)
        )"""


# Running jobs of a key (ix_jobs_key_held).
def _running(key: str) -> str:
    return f"""(SELECT count(*) FROM jobq.jobs h
               WHERE h.queue = :queue AND h.key = {key} AND h.status = 'running')"""


# The walk's next key after `key`, locked: the next key with pending jobs, or once past the last (and
# not `wrapped` yet), the first; none once it would pass `after` again, where the walk began. A row of
# (key, wrapped, locked), or none when the walk is done.
def _next_key(key: str, wrapped: str, after: str) -> str:
    # OFFSET 0 keeps each subquery whole, so the lock runs once for its key and not again per reference.
    return f"""(
            SELECT key, wrapped, {_KEY_LOCK.format(key="key")} AS locked FROM (
                SELECT coalesce(later, CASE WHEN NOT {wrapped} THEN {_keys_with_pending("''")} END) AS key,
                       {wrapped} OR later IS NULL AS wrapped
                FROM (SELECT {_keys_with_pending(key)} AS later OFFSET 0) l
                OFFSET 0
            ) c
            WHERE key IS NOT NULL AND NOT (wrapped AND key > {after})
            OFFSET 0
        )"""


# Walk the keys with pending jobs after :after, in key order, on from the first key once past the last
# and up to :after again, locking each, until :scan are locked or :reach looked at: a row per key looked
# at, `locked` false for one another claim holds (passed over, as SKIP LOCKED passes over a row, and the
# walk goes on past it: two claims starting from one place take consecutive stretches of keys instead of
# the second finding the first's keys held). The lock is taken in the recursive step itself, once per key,
# so the walk stops as soon as it has enough. :after NULL is the queue's own `fair_last_key`, the key its
# last claim served last (a `fair` queue's turn, kept for every replica); otherwise the caller keeps the
# last key as its next :after. A queue with a rate also locks its row first, so that its claims take turns.
# (Passing over full keys here, by a running count read before the lock, cost more than LEASE_FLOW
# finding them full.)
def _flow_keys(rated: bool) -> str:
    rate_turn = """rate_turn AS (
        SELECT name FROM jobq.queues WHERE name = :queue AND rate_limit IS NOT NULL FOR NO KEY UPDATE
    ), """
    return f"""
    WITH RECURSIVE {rate_turn if rated else ""}start AS (
        SELECT coalesce(:after::text, (SELECT fair_last_key FROM jobq.queues WHERE name = :queue), '')
            AS after
        WHERE EXISTS (SELECT FROM jobq.queues WHERE name = :queue AND NOT paused AND flow)
          {"AND (SELECT count(*) FROM rate_turn) >= 0" if rated else ""}
    ), walk(key, wrapped, after, locked, got, n) AS (
        SELECT k.key, k.wrapped, s.after, k.locked, k.locked::int, 1
        FROM start s, LATERAL {_next_key("s.after", "false", "s.after")} k
        UNION ALL
        SELECT k.key, k.wrapped, w.after, k.locked, w.got + k.locked::int, w.n + 1
        FROM walk w, LATERAL {_next_key("w.key", "w.wrapped", "w.after")} k
        WHERE w.got < :scan AND w.n < :reach
    )
    SELECT key, locked FROM walk
    """


FLOW_KEYS = Query.define("flow_keys", _flow_keys(rated=False))
FLOW_KEYS_RATED = Query.define("flow_keys_rated", _flow_keys(rated=True))


# Claim up to one job per slot (as LEASE) from the keys FLOW_KEYS locked (:keys, in the order walked)
# and from the jobs without a key, within every limit:
# - `room`: per key, its concurrency (or its override) less its running jobs, and within its rate
#   window; a key whose jobs run in order (concurrency 1) with a job waiting for its retry gets that job
#   when it is due, and nothing else: the retry holds the key, as an SQS FIFO message group is held;
# - `candidates`: each key's first ready jobs, as many as its room; jobs without a key from the front of
#   the queue (the first :lookahead ready jobs);
# - `chosen`: in lease order (priority, run_at, id), or with `fair` round by round: every key's first job
#   (in turn: from the key after the queue's `fair_last_key`, as this statement reads it, on to the last
#   key, then from the first), then every key's second, ...; as many as the slots, or as the queue's rate
#   window has room for; each locked (SKIP LOCKED: a job another statement holds is passed over, which
#   for a key in order means nothing of it this time).
# Then the chosen jobs are leased as LEASE leases them, each slot's settings read from the arrays by its
# number (no join whose plan could go quadratic). With `fair`, the key of the last slot leased becomes
# the queue's `fair_last_key` (`turned`), where the next claim's turn begins, on any replica. The turn is
# read here again, not only by FLOW_KEYS: this statement begins once the keys' locks are held, so it
# sees the turn of every claim that held them before. It is written unless another claim is writing it
# at that moment (SKIP LOCKED: a claim never waits for the queue's row, and never for a statement that
# holds the row and waits for a job this claim holds); that claim's turn stands, which served keys
# beside this one's. A queue with a rate writes it with its window (its claims hold the row already).
# Always one row at least: `wake_in`, the seconds
# until a rate window next lets a job go when one held some back (NULL otherwise); `id` NULL when nothing
# was leased.
# Two variants, since a claim's planning cost as much as its work: LEASE_FLOW for queues without rates
# (it claims nothing from a queue with a rate, and nothing of a key with a rate of its own), and
# LEASE_FLOW_RATED, which keeps the rate windows of the queue and of each key: the claim's leases added
# to them in the same statement.
def _lease_flow(rated: bool) -> str:
    if rated:
        wanted = f"""greatest(least(cardinality(:worker_ids::text[]),
                              q.rate_limit - {_used("q.rate_times", "q.rate_counts", "q.rate_period")}), 0)"""
        key_room = f"k.rate_limit - {_used('k.rate_times', 'k.rate_counts', 'k.rate_period')}"
        unrated = ""
    else:
        wanted, key_room = "cardinality(:worker_ids::text[])", "NULL"
        unrated = "AND rate_limit IS NULL AND key_rate_limit IS NULL"
    windows = f"""
    , per_key AS (
        SELECT key, count(*)::int AS n FROM leased WHERE key IS NOT NULL GROUP BY key
    ), key_windows AS (
        INSERT INTO jobq.keys AS o (queue, key, rate_times, rate_counts)
        SELECT :queue, k.key, w.times || {WINDOW_CLOCK}, w.counts || p.n
        FROM per_key p JOIN k USING (key), LATERAL {_window("k")} w
        WHERE k.rate_limit IS NOT NULL
        ON CONFLICT (queue, key) DO UPDATE SET rate_times = excluded.rate_times,
                                               rate_counts = excluded.rate_counts
    ), queue_window AS (
        UPDATE jobq.queues qs SET rate_times = w.times || {WINDOW_CLOCK}, rate_counts = w.counts || l.n,
            fair_last_key = CASE WHEN q.fair THEN coalesce((SELECT key FROM served), qs.fair_last_key)
                                 ELSE qs.fair_last_key END
        FROM (SELECT count(*)::int AS n FROM leased) l, q, LATERAL {_window("q")} w
        WHERE qs.name = :queue AND q.rate_limit IS NOT NULL AND l.n > 0
    ), wake AS (
        SELECT extract(epoch FROM min(expires) - {WINDOW_CLOCK})::float8 AS wake_in FROM (
            SELECT min(t) + make_interval(secs => q.rate_period) AS expires
            FROM q, unnest(q.rate_times, q.rate_counts) AS w(t, c)
            WHERE q.rate_limit IS NOT NULL AND t > {WINDOW_CLOCK} - make_interval(secs => q.rate_period)
              AND (SELECT n FROM wanted) = 0
            GROUP BY q.rate_period
            UNION ALL
            SELECT min(t) + make_interval(secs => r.rate_period)
            FROM (SELECT * FROM room WHERE rate_limit IS NOT NULL) r,
                 unnest(r.rate_times, r.rate_counts) AS w(t, c)
            WHERE t > {WINDOW_CLOCK} - make_interval(secs => r.rate_period)
              AND r.rate_limit - {_used("r.rate_times", "r.rate_counts", "r.rate_period")} <= 0
            GROUP BY r.key, r.rate_period
        ) held_back
    )"""
    return f"""
    WITH q AS (
        SELECT max_attempts, visibility_timeout, key_concurrency, fair, rate_limit, rate_period,
               key_rate_limit, key_rate_period, rate_times, rate_counts, fair_last_key
        FROM jobq.queues WHERE name = :queue AND NOT paused AND flow {unrated}
    ), wanted AS (
        SELECT {wanted} AS n FROM q
    ), k AS (
        SELECT u.key,
               CASE WHEN q.fair THEN row_number() OVER (
                   ORDER BY u.key <= coalesce(q.fair_last_key, ''), u.key) ELSE u.turn END AS turn,
               coalesce(o.concurrency, q.key_concurrency) AS concurrency,
               coalesce(o.rate_limit, q.key_rate_limit) AS rate_limit,
               coalesce(o.rate_period, q.key_rate_period) AS rate_period, o.rate_times, o.rate_counts
        FROM q CROSS JOIN unnest(:keys::text[]) WITH ORDINALITY AS u(key, turn)
        LEFT JOIN jobq.keys o ON o.queue = :queue AND o.key = u.key
        {"" if rated else "WHERE o.rate_limit IS NULL"}
    ), room AS (
        SELECT k.*, least(wanted.n, k.concurrency - {_running("k.key")}, {key_room}) AS room,
               CASE WHEN k.concurrency = 1 THEN (
                   SELECT id FROM jobq.jobs h
                   WHERE h.queue = :queue AND h.key = k.key AND {KEY_HOLDER}
                   ORDER BY priority, id LIMIT 1) END AS retry
        FROM k CROSS JOIN wanted
    ), candidates AS (
        SELECT j.id, j.priority, j.run_at, r.turn, 1::bigint AS round
        FROM room r JOIN jobq.jobs j ON j.id = r.retry
        WHERE r.room > 0 AND j.run_at <= now()
        UNION ALL
        SELECT c.id, c.priority, c.run_at, r.turn, c.round
        FROM room r, LATERAL (
            SELECT id, priority, run_at, row_number() OVER (ORDER BY priority, run_at, id) AS round
            FROM (SELECT id, priority, run_at FROM jobq.jobs
                  WHERE queue = :queue AND key = r.key AND status = 'pending' AND run_at <= now()
                  ORDER BY priority, run_at, id
                  LIMIT r.room) first_ready
        ) c
        WHERE r.room > 0 AND r.retry IS NULL
        UNION ALL
        SELECT id, priority, run_at, 0, row_number() OVER (ORDER BY priority, run_at, id)
        FROM (SELECT id, key, priority, run_at FROM jobq.jobs
              WHERE queue = :queue AND status = 'pending' AND run_at <= now() AND EXISTS (SELECT FROM q)
              ORDER BY priority, run_at, id
              LIMIT :lookahead) front
        WHERE key IS NULL
    ), chosen AS (
        SELECT c.id, row_number() OVER (
                   ORDER BY CASE WHEN q.fair THEN c.round END, CASE WHEN q.fair THEN c.turn END,
                            c.priority, c.run_at, c.id) AS ord
        FROM candidates c CROSS JOIN q
        ORDER BY ord
        LIMIT coalesce((SELECT n FROM wanted), 0)
    ), locked AS (
        SELECT c.id, c.ord FROM chosen c JOIN jobq.jobs j ON j.id = c.id
        WHERE j.status = 'pending'
        FOR UPDATE OF j SKIP LOCKED
    ), ready AS (
        SELECT id, row_number() OVER (ORDER BY ord) AS slot FROM locked
    ), leased AS (
        UPDATE jobq.jobs j
        SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(
                secs => coalesce((:visibility_timeouts::float8[])[ready.slot], q.visibility_timeout)),
            worker_id = (:worker_ids::text[])[ready.slot], updated_at = now(), debounce_key = NULL
        FROM ready, q
        WHERE j.id = ready.id
        RETURNING {LEASED_JOB}, ready.slot
    ), served AS (
        SELECT key FROM leased WHERE key IS NOT NULL ORDER BY slot DESC LIMIT 1
    ), turned AS (
        UPDATE jobq.queues qs SET fair_last_key = served.key
        FROM served
        WHERE qs.name = (SELECT name FROM jobq.queues
                         WHERE name = :queue AND (SELECT fair AND rate_limit IS NULL FROM q)
                           AND EXISTS (SELECT FROM served)
                         FOR NO KEY UPDATE SKIP LOCKED)
    ){windows if rated else ", wake AS (SELECT NULL::float8 AS wake_in)"}
    SELECT leased.*, wake.wake_in FROM wake LEFT JOIN leased ON true
    """


LEASE_FLOW = Query.define("lease_flow", _lease_flow(rated=False))
LEASE_FLOW_RATED = Query.define("lease_flow_rated", _lease_flow(rated=True))

# A queue under key concurrency alone (no `fair`, no rate) is first claimed from its front, as LEASE
# claims. Walking the keys reads each key's jobs through its own index descents and takes jobs scattered
# over the table (a key's next jobs lie far apart); the front is one scan of the claim index over jobs that
# lie together, so while the front of the queue has room (its keys not full) a claim costs little more
# than LEASE (statement bench, 100 jobs over 1,000 keys: 2.9 ms against 2.1 for LEASE and 3.9 for the
# walk). A claim that finds the front held (full keys, keys another claim holds) walks the keys for the
# slots left (app/service/flow.py).
# The claim is jobq.lease_flow_front() (app/db/functions.sql; its two statements are FRONT and LEASE of
# alembic 0021, where tests read them): the first locks the first :lookahead ready jobs in lease order
# and tries their keys' locks, the second, whose snapshot begins once the locks are held (as
# LEASE_FLOW's), leases those within their key's room.
# One call in one round trip, where the two statements in a transaction of their own took four: the
# keyed drain went from 24,662 to 27,100 jobs/s. Rows as LEASE's, each with its slot, and on every row
# (on one row of NULL jobs when nothing was leased) how many jobs it `looked` at, and how many it
# `passed` over because another claim held their key.
LEASE_FLOW_FRONT = Query.define(
    "lease_flow_front",
    "SELECT * FROM jobq.lease_flow_front(:queue, :lookahead, :visibility_timeouts, :worker_ids, :per_key)",
)
