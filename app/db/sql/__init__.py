"""Every SQL statement jobq runs, each with a name, a purpose and its reasons, one module per topic:

- enqueue.py: batches of jobs inserted, their queues made on first use; a duplicate's holder
- parents.py: a job's parents: linked, their results for a lease, a page of them
- workflows.py: workflows made, read, listed, cancelled and retried
- idempotency.py: enqueues that keep their answer under an idempotency key; the kept answers
- jobs.py: one job by id: read, cancelled, run now, watched by a waiter
- claim.py: leases: LEASE, and under flow control FLOW_KEYS, LEASE_FLOW, LEASE_FLOW_FRONT
- ends.py: the end of a lease: ack, nack, release, extend, expiry; SQS retention
- durable.py: steps recorded under a lease, waits for events, events sent, kept and pruned
- history.py: finished jobs in jobq.jobs_history, pruned by retention
- dead.py: dead jobs listed, retried, purged; SQS redrive
- lists.py: GET /jobs, a bounded window at a time
- queues.py: settings, pause, counts; SQS PurgeQueue and DeleteQueue
- keys.py: flow control's keys and their overrides
- push.py: push targets, their secrets, the gate of a claim of deliveries, holds
- workers.py: workers seen
- rollups.py: per-minute counts
- gauges.py: metrics' gauges, lock waits, vacuum's horizon, the schema's revision
- schedules.py: schedules and the scheduler's firings, and its leadership
- vacuum.py: the vacuum loop's look at jobq.jobs, its lock, and the VACUUM
- sqs.py: what only the SQS API needs (not re-exported: ``from app.db.sql import sqs as sq``)

query.py defines ``Query``, and fragments.py the SQL several topics share. This module re-exports every
statement and every public name of those modules, so callers write ``from app.db import sql as q``.

Statements are written with named parameters (``:queue``); ``Query`` rewrites them once, at import, to
asyncpg's positional ``$n`` and binds arguments by name, so a long statement never depends on argument
order. Each state change names the state it expects (and the lease token, where one fences it) in its
``WHERE`` and uses ``RETURNING``: no row back means the job was not in that state, which is an answer.

A job's status changes only through the statements of this package, and through ``jobq.enqueue()``, the
SQL function producers call in their own transaction (app/db/functions.sql). Which statement moves a job
from which status to which is app/core/states.py (``MOVES``); tests/service/test_states.py runs each statement
against a job in each status and checks it lands there, and that no other statement here changes a
status. Statuses are written in the SQL as literals ('pending'): the test checks each is a ``JobStatus``.
"""

# ruff: noqa: F401 (every import here is a re-export; tests/service/test_states.py checks none is missing)
from __future__ import annotations

from app.db.sql.claim import FLOW_KEYS, FLOW_KEYS_RATED, LEASE, LEASE_FLOW, LEASE_FLOW_FRONT, LEASE_FLOW_RATED
from app.db.sql.dead import (
    DEAD_JOBS,
    DEAD_JOBS_IN_QUEUE,
    FORGET_DEAD_LETTERS,
    PURGE_DEAD,
    PURGE_DEAD_JOBS,
    REDRIVE_DEAD,
    RETRY_DEAD,
    RETURN_DEAD_LETTERS,
)
from app.db.sql.durable import (
    AWAIT_EVENT,
    EXPIRE_WAITS,
    LIST_EVENTS,
    PRUNE_EVENTS,
    PRUNE_JOURNALS,
    RECORD_STEP,
    SEND_EVENT,
    STEP_REFUSED,
)
from app.db.sql.ends import (
    ACK,
    EXPIRE_LEASES,
    EXPIRE_MESSAGES,
    EXTEND,
    JOB_QUEUES,
    LEASE_STATUS,
    NACK,
    RELEASE,
    REVIVE_LEASE,
)
from app.db.sql.enqueue import DEDUP_HOLDERS, ENQUEUE, ENQUEUE_DEBOUNCED, ENQUEUE_NEW, ENQUEUE_WAITING
from app.db.sql.fragments import (
    CHANNEL,
    DONE_CHANNEL,
    JOB,
    JOB_COLUMNS,
    JOURNAL,
    KEY_FREED,
    LEASED_JOB,
    LEASED_JOURNAL,
    LOCKED,
    NOTIFIED,
    QUEUE_LOCK_CLASS,
    RETAINED,
    TRACED,
    TRACED_OUT,
    WINDOW_CLOCK,
)
from app.db.sql.gauges import (
    FLOW_GAUGES,
    LOCK_WAITS,
    QUEUE_GAUGES,
    SCHEMA_REVISION,
    TABLE_HEALTH,
    VACUUM_HORIZON,
)
from app.db.sql.history import HISTORY_DAYS, HISTORY_PARTITIONS, MOVE_FINISHED, PRUNE_HISTORY_DEFAULT
from app.db.sql.idempotency import (
    ANSWERS,
    CLAIM_KEY,
    ENQUEUE_NEW_EACH_ONCE,
    ENQUEUE_NEW_ONCE,
    FREE_EXPIRED_KEY,
    KEEP_ANSWER,
    KEEP_ANSWERS,
    KEPT_KEY,
    PRUNE_IDEMPOTENCY_KEYS,
)
from app.db.sql.jobs import CANCEL, CANCEL_JOBS, GET_JOB, GET_JOBS, JOB_STATUS, RUN_NOW, WATCH_JOB, WATCH_JOBS
from app.db.sql.keys import DELETE_KEY, GET_KEY, KEY, LIST_KEYS, PRUNE_KEYS, PUT_KEY
from app.db.sql.lists import (
    BYTE_UNIT,
    HISTORY_STATUSES,
    LIST_PAGE,
    LIST_SOURCES,
    LIST_WINDOW,
    SCOPE_QUEUES,
    list_filters,
)
from app.db.sql.parents import ADD_PARENTS, JOB_CHILDREN, JOB_PARENTS, PARENTS, PARENTS_OUT_OF_SCOPE
from app.db.sql.push import (
    HOLD_PUSH,
    PRUNE_PUSH_HOLDS,
    PUSH_GATE,
    PUSH_LOCK_CLASS,
    PUSH_TARGETS,
    PUSH_WORKER_PREFIX,
    ROTATE_PUSH_SECRET,
    SET_PUSH,
    push_lock,
)
from app.db.sql.query import Query
from app.db.sql.queues import (
    CONFIGURE_FLOW,
    CONFIGURE_QUEUE,
    DELETE_QUEUE,
    LOCK_QUEUE,
    LOCK_QUEUE_ROW,
    PURGE_QUEUE,
    QUEUE_CANCELLED,
    QUEUE_EXISTS,
    QUEUE_FLOW,
    QUEUE_STATS,
    SET_FLOW,
    SET_PAUSED,
)
from app.db.sql.rollups import FORGET_ROLLUPS, ROLL_UP, ROLLUP_COMPLETED, ROLLUP_SERIES
from app.db.sql.schedules import (
    ADVANCE_SCHEDULE,
    DELETE_SCHEDULE,
    DUE_SCHEDULES,
    FIRE_DUE_SCHEDULES,
    FIRE_SCHEDULE,
    GET_SCHEDULE,
    GIVE_UP_LEAD,
    LIST_SCHEDULES,
    LOCK_SCHEDULE,
    NEXT_DUE,
    PUT_SCHEDULE,
    SCHEDULE,
    SET_SCHEDULE_PAUSED,
    TAKE_LEAD,
)
from app.db.sql.vacuum import MAINTENANCE_LOCK, MAINTENANCE_UNLOCK, VACUUM_HEALTH, VACUUM_JOBS
from app.db.sql.workers import FORGET_WORKERS, LIST_WORKERS, SEE_WORKERS
from app.db.sql.workflows import (
    CANCEL_WORKFLOW_JOBS,
    DRAW_JOB_IDS,
    GET_WORKFLOW,
    LIST_WORKFLOWS,
    MARK_CANCELLED,
    NEW_WORKFLOW,
    PRUNE_WORKFLOWS,
    RETRY_WORKFLOW,
    RUNNING_WORKFLOWS,
    SET_WORKFLOW_STATUS,
    WORKFLOW_JOBS,
)
