"""A job's statuses and the state machine, the one definition: the `status` column and its CHECK constraint
(app/db/tables.py), the API's `status` fields, and which statement moves a job from which status to which
(``MOVES``).

A job's status changes only through the statements of app/db/sql, and through ``jobq.enqueue()``, the SQL
function producers call in their own transaction (app/db/functions.sql). tests/service/test_states.py runs
each of them against a job in each status and checks that it lands where ``MOVES`` says, that a status
``MOVES`` does not name for it stays as it was, that no other statement changes a status, and that this table
says the same as ``MOVES`` (a note in parentheses: the case in which the statement makes that move):

=========  ==================================================  ============================================
status     led in by                                           led out by
=========  ==================================================  ============================================
waiting    ENQUEUE_WAITING (with parents), jobq.enqueue()      jobq.decide(), SEND_EVENT, EXPIRE_WAITS,
           (with parents), jobq.retry_workflow() (cancelled    CANCEL, CANCEL_JOBS, CANCEL_WORKFLOW_JOBS,
           by a parent's end), AWAIT_EVENT (parked)            DELETE_QUEUE
pending    ENQUEUE_NEW, ENQUEUE, ENQUEUE_NEW_ONCE,             LEASE, LEASE_FLOW, LEASE_FLOW_RATED,
           ENQUEUE_NEW_EACH_ONCE, jobq.enqueue(),              LEASE_FLOW_FRONT, REVIVE_LEASE (the last
           FIRE_SCHEDULE, FIRE_DUE_SCHEDULES,                  holder, late), ACK (the last holder, late),
           ENQUEUE_DEBOUNCED (a new job), ENQUEUE_WAITING      CANCEL, CANCEL_JOBS, CANCEL_WORKFLOW_JOBS,
           (without parents), jobq.decide() (run_if holds),    PURGE_QUEUE, DELETE_QUEUE
           NACK (attempts left), RELEASE, EXPIRE_LEASES
           (attempts left), AWAIT_EVENT (an event sent
           before), SEND_EVENT, EXPIRE_WAITS,
           jobq.retry_workflow(), RETRY_DEAD, REDRIVE_DEAD
           (into another queue)
running    LEASE, LEASE_FLOW, LEASE_FLOW_RATED,                ACK, NACK, RELEASE, AWAIT_EVENT,
           LEASE_FLOW_FRONT, REVIVE_LEASE (the last holder,    EXPIRE_LEASES, EXPIRE_MESSAGES,
           late)                                               PURGE_QUEUE, DELETE_QUEUE
completed  ACK                                                 MOVE_FINISHED (past its retention already),
                                                               PRUNE_HISTORY_DEFAULT (past its
                                                               purge_after), DELETE_QUEUE
dead       NACK (dead, or out of attempts), EXPIRE_LEASES      ACK (the last holder, late),
           (out of attempts)                                   jobq.retry_workflow(), RETRY_DEAD,
                                                               PURGE_DEAD, PURGE_DEAD_JOBS, REDRIVE_DEAD
                                                               (into another queue), DELETE_QUEUE
cancelled  jobq.decide() (run_if does not hold), CANCEL,       jobq.retry_workflow() (cancelled by a
           CANCEL_JOBS, CANCEL_WORKFLOW_JOBS                   parent's end), MOVE_FINISHED (past its
                                                               retention already), PRUNE_HISTORY_DEFAULT
                                                               (past its purge_after), DELETE_QUEUE
=========  ==================================================  ============================================

Completed and cancelled jobs live in jobq.jobs_history (app/db/sql/fragments.py, JOB_COLUMNS), the others
in jobq.jobs. Led out by a DELETE (PURGE_*, PRUNE_HISTORY_DEFAULT, DELETE_QUEUE, EXPIRE_MESSAGES, and
MOVE_FINISHED for a job past its retention), or when retention drops a day's partition of jobs_history
(app/service/history.py), the row is gone. Some statements act on a job and keep its status (a move from
a status to itself in ``MOVES``): EXTEND keeps a running job running, RUN_NOW a pending job pending,
RETURN_DEAD_LETTERS a pending job pending (in another queue), MOVE_FINISHED a finished job finished (moved
from jobq.jobs, where an older release left it, to jobq.jobs_history). Statuses are written in the SQL
as literals ('pending'): the test checks each is a ``JobStatus``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


# A job's status: the `status` column and its CHECK constraint, the API's `status` fields (openapi.json
# lists them from here). Which statement moves a job from one status to another is MOVES below.
class JobStatus(enum.StrEnum):
    """A job's status: waiting (for its parents to end), pending (waiting to run, now or at its run_at),
    running (leased to a worker), completed (acked), dead (out of attempts, or nacked as dead; kept until
    retried or purged) or cancelled (before it ran)."""

    # Cannot run yet: it waits for its parents (depends_on) to end, and is then decided, pending or
    # cancelled (jobq.decide(), app/db/functions.sql). Never leased.
    WAITING = "waiting"
    # Waiting to run, including jobs whose run_at is still in the future.
    PENDING = "pending"
    # Leased to a worker until lease_expires_at, fenced by lease_token; each lease counts an attempt.
    RUNNING = "running"
    # Done. Final; pruned after the queue's retention.
    COMPLETED = "completed"
    # Out of attempts or nacked with dead=true; kept for inspection until retried or purged.
    DEAD = "dead"
    # Cancelled before it ran. Final; pruned like completed jobs.
    CANCELLED = "cancelled"


# The statuses a wait for a job ends on (`GET /jobs/{id}?wait=N`): nothing more happens to the job unless
# someone acts on it (a dead job retried).
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED})


def status_in(*statuses: JobStatus) -> str:
    """`status IN ('a', 'b')`: the SQL test for these statuses."""
    return status_in_values(statuses)


def status_in_values(statuses: Iterable[enum.StrEnum]) -> str:
    """`status IN ('a', 'b')` for any statuses (a job's, a workflow's)."""
    return f"status IN ({', '.join(repr(str(s)) for s in statuses)})"


@dataclass(frozen=True)
class Move:
    """`statement` (its name in app/db/sql, or an SQL function) moves a job from `before` (None: the
    statement creates it) to `after` (None: it deletes the row), in the case `when` (empty: always)."""

    statement: str
    before: JobStatus | None
    after: JobStatus | None
    when: str = ""


WAITING, PENDING, RUNNING, COMPLETED, DEAD, CANCELLED = JobStatus


class WorkflowStatus(enum.StrEnum):
    """A workflow's status, from its jobs': running while any of them may still run (waiting, pending or
    running); then completed (every job completed), failed (one at least dead, or cancelled), or cancelled
    (by DELETE /workflows/{id})."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset({JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING})


def workflow_status(statuses: Iterable[str], cancelled: bool = False) -> WorkflowStatus:
    """A workflow's status from its jobs' (`cancelled`: a DELETE /workflows/{id} cancelled it): running
    while one may still run, then failed when one is dead or cancelled, else completed."""
    if cancelled:
        return WorkflowStatus.CANCELLED
    seen = set(statuses)
    if seen & ACTIVE:
        return WorkflowStatus.RUNNING
    if seen & {JobStatus.DEAD, JobStatus.CANCELLED}:
        return WorkflowStatus.FAILED
    return WorkflowStatus.COMPLETED


class RunIf(enum.StrEnum):
    """What a job's parents must end as for it to run, once the last of them has ended; else it is
    cancelled."""

    COMPLETED = "completed"  # every parent completed
    FINISHED = "finished"  # whatever they ended as (completed, dead or cancelled)
    FAILED = "failed"  # one at least is dead or cancelled


# Every move of a job, in the order of a job's life. A statement that moves one status two ways names
# the case of each (`when`); a status it does not name, it leaves alone.
MOVES: tuple[Move, ...] = (
    # Enqueued: every statement that creates a job makes it pending (app/db/sql/enqueue.py,
    # idempotency.py, schedules.py).
    Move("ENQUEUE_NEW", None, PENDING),
    Move("ENQUEUE", None, PENDING),
    Move("ENQUEUE_NEW_ONCE", None, PENDING),
    Move("ENQUEUE_NEW_EACH_ONCE", None, PENDING),
    Move("jobq.enqueue()", None, PENDING),
    Move("FIRE_SCHEDULE", None, PENDING),
    Move("FIRE_DUE_SCHEDULES", None, PENDING),
    # A job with parents waits for them (app/db/sql/enqueue.py, ENQUEUE_WAITING), and is decided when the
    # last of them ends, by the transaction that ends it (the triggers job_dead and job_gone), or at
    # once when they had all ended (jobq.add_parents()).
    # A debounced enqueue (app/db/sql/enqueue.py, ENQUEUE_DEBOUNCED) makes a job, or lands in the pending
    # job of its debounce key.
    Move("ENQUEUE_DEBOUNCED", None, PENDING, "a new job"),
    Move("ENQUEUE_DEBOUNCED", PENDING, PENDING, "its key's pending job"),
    Move("ENQUEUE_WAITING", None, WAITING, "with parents"),
    Move("ENQUEUE_WAITING", None, PENDING, "without parents"),
    Move("jobq.enqueue()", None, WAITING, "with parents"),
    Move("jobq.decide()", WAITING, PENDING, "run_if holds"),
    Move("jobq.decide()", WAITING, CANCELLED, "run_if does not hold"),
    # Claimed (app/db/sql/claim.py), and an SQS message whose visibility ran out made visible again by the
    # receive that had it (ends.py).
    Move("LEASE", PENDING, RUNNING),
    Move("LEASE_FLOW", PENDING, RUNNING),
    Move("LEASE_FLOW_RATED", PENDING, RUNNING),
    Move("LEASE_FLOW_FRONT", PENDING, RUNNING),
    Move("REVIVE_LEASE", PENDING, RUNNING, "the last holder, late"),
    # A lease's end (app/db/sql/ends.py). An ack by the holder of the job's last lease token completes it
    # even after the lease expired (the work was done).
    Move("ACK", RUNNING, COMPLETED),
    Move("ACK", PENDING, COMPLETED, "the last holder, late"),
    Move("ACK", DEAD, COMPLETED, "the last holder, late"),
    Move("NACK", RUNNING, PENDING, "attempts left"),
    Move("NACK", RUNNING, DEAD, "dead, or out of attempts"),
    Move("RELEASE", RUNNING, PENDING),
    Move("EXTEND", RUNNING, RUNNING, "its lease's deadline moved"),
    Move("EXPIRE_LEASES", RUNNING, PENDING, "attempts left"),
    Move("EXPIRE_LEASES", RUNNING, DEAD, "out of attempts"),
    Move("EXPIRE_MESSAGES", RUNNING, None),
    # Durable waits for events (app/db/sql/durable.py, jobq.await_event() and jobq.send_event()): a lease
    # ends with the job parked until an event, or pending at once when one was sent before; an event, or
    # the wait's deadline, makes it pending.
    Move("AWAIT_EVENT", RUNNING, WAITING, "parked"),
    Move("AWAIT_EVENT", RUNNING, PENDING, "an event sent before"),
    Move("SEND_EVENT", WAITING, PENDING),
    Move("EXPIRE_WAITS", WAITING, PENDING),
    # Operators (app/db/sql/jobs.py, dead.py).
    Move("CANCEL", PENDING, CANCELLED),
    Move("CANCEL", WAITING, CANCELLED),
    Move("CANCEL_JOBS", PENDING, CANCELLED),
    Move("CANCEL_JOBS", WAITING, CANCELLED),
    Move("CANCEL_WORKFLOW_JOBS", PENDING, CANCELLED),
    Move("CANCEL_WORKFLOW_JOBS", WAITING, CANCELLED),
    # A failed workflow resumed (app/db/sql/workflows.py, RETRY_WORKFLOW).
    Move("jobq.retry_workflow()", DEAD, PENDING),
    Move("jobq.retry_workflow()", CANCELLED, WAITING, "cancelled by a parent's end"),
    Move("RUN_NOW", PENDING, PENDING, "ready now"),
    Move("RETRY_DEAD", DEAD, PENDING),
    Move("PURGE_DEAD", DEAD, None),
    Move("PURGE_DEAD_JOBS", DEAD, None),
    # Retention (app/db/sql/history.py); and a day's partition of jobq.jobs_history dropped whole
    # (app/service/history.py), which is no statement's.
    Move("MOVE_FINISHED", COMPLETED, COMPLETED, "into jobq.jobs_history"),
    Move("MOVE_FINISHED", CANCELLED, CANCELLED, "into jobq.jobs_history"),
    Move("MOVE_FINISHED", COMPLETED, None, "past its retention already"),
    Move("MOVE_FINISHED", CANCELLED, None, "past its retention already"),
    Move("PRUNE_HISTORY_DEFAULT", COMPLETED, None, "past its purge_after"),
    Move("PRUNE_HISTORY_DEFAULT", CANCELLED, None, "past its purge_after"),
    # SQS: redrive into a dead-letter queue and back (app/db/sql/dead.py), PurgeQueue and DeleteQueue
    # (queues.py).
    Move("REDRIVE_DEAD", DEAD, PENDING, "into another queue"),
    Move("RETURN_DEAD_LETTERS", PENDING, PENDING, "back into the queue it came from"),
    Move("PURGE_QUEUE", PENDING, None),
    Move("PURGE_QUEUE", RUNNING, None),
    *(Move("DELETE_QUEUE", status, None) for status in JobStatus),
)


def led_in(status: JobStatus) -> tuple[Move, ...]:
    """The moves that bring a job into `status` from another (or create it there)."""
    return tuple(move for move in MOVES if move.after == status and move.before != status)


def led_out(status: JobStatus) -> tuple[Move, ...]:
    """The moves that take a job out of `status`, into another or out of the tables."""
    return tuple(move for move in MOVES if move.before == status and move.after != status)
