"""A job's statuses, the one definition: the `status` column and its CHECK constraint (app/db/tables.py),
the API's `status` fields, and the statements that move a job between them (app/db/sql).
"""

from __future__ import annotations

import enum


# A job's status: the `status` column and its CHECK constraint, the API's `status` fields (openapi.json
# lists them from here). Which statement moves a job from one status to another is the table at the head
# of app/db/sql/__init__.py; tests/test_states.py runs every statement against every status and checks it.
class JobStatus(enum.StrEnum):
    """A job's status: pending (waiting to run, now or at its run_at), running (leased to a worker),
    completed (acked), dead (out of attempts, or nacked as dead; kept until retried or purged) or
    cancelled (before it ran)."""

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
    return f"status IN ({', '.join(repr(str(s)) for s in statuses)})"
