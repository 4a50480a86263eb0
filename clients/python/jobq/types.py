"""What the jobq client answers with: the result dataclasses and the errors, one per problem `code`.

Import them from here (`from jobq.types import LeasedJob`); the errors an application catches most
(`JobqError`, `LeaseLost`, `NotFound`, `Conflict`, `Unavailable`, `ValidationError`) also from `jobq`.
Results are small frozen dataclasses read from the answers' JSON; fields the service adds later are
ignored, so an older client keeps working.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")


# --- errors ----------------------------------------------------------------------------------------


class JobqError(Exception):
    """An error answer (an RFC 9457 problem), or no answer at all (`status` is None then)."""

    code = "error"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code or type(self).code
        self.problem: dict[str, Any] = dict(problem or {})


class ValidationError(JobqError):
    code = "validation_error"


class Unauthorized(JobqError):
    code = "unauthorized"


class Forbidden(JobqError):
    code = "forbidden"


class NotFound(JobqError):
    code = "not_found"


class LeaseLost(JobqError):
    """The lease token is not the job's current one: the lease expired and moved on, or was ended."""

    code = "lease_lost"


class Conflict(JobqError):
    """The job is not in a state that allows this (cancel a running job, purge a live one)."""

    code = "conflict"


class PayloadTooLarge(JobqError):
    code = "payload_too_large"


class Unavailable(JobqError):
    """The service cannot do it now (its database is unreachable); try again later."""

    code = "unavailable"


class Unreachable(Unavailable):
    """No answer: connection refused, reset or timed out, after the retries."""

    code = "unreachable"


_BY_CODE: dict[str, type[JobqError]] = {
    cls.code: cls
    for cls in (ValidationError, Unauthorized, Forbidden, NotFound, LeaseLost, Conflict, PayloadTooLarge)
} | {Unavailable.code: Unavailable}
# For answers without a problem body (a proxy in between, an older service).
_BY_STATUS: dict[int, type[JobqError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    503: Unavailable,
}


def error_from(status: int, content: bytes, reason: str = "") -> JobqError:
    """The exception an error answer stands for: its status, body and reason phrase."""
    try:
        problem = json.loads(content)
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {}
    code = problem.get("code")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    cls = cls or _BY_STATUS.get(status, JobqError)
    detail = problem.get("detail") or content[:300].decode(errors="replace") or reason
    return cls(str(detail), status=status, code=code, problem=problem)


# --- results ---------------------------------------------------------------------------------------


class JobStatus(StrEnum):
    """A job's status, as the service's `status` fields spell it (a str: `job.status == "dead"` holds)."""

    WAITING = "waiting"  # waiting for its parents (depends_on) to end
    PENDING = "pending"  # waiting to run (now, or at run_at)
    RUNNING = "running"  # leased to a worker
    COMPLETED = "completed"  # acked; kept for the queue's retention
    DEAD = "dead"  # out of attempts, or nacked with dead=true; kept until retried or purged
    CANCELLED = "cancelled"  # cancelled before it ran


# The statuses a wait for a job ends on: nothing more happens to the job unless someone acts on it.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED})


class CatchUp(StrEnum):
    """What a schedule enqueues for the times it missed (the service was down): times reached more than
    the service's grace late (JOBQ_SCHEDULE_GRACE, 30 s by default). A str, like JobStatus."""

    SKIP = "skip"  # nothing: the next time on time enqueues the next job
    ONCE = "once"  # one job, for the latest time missed (the service's default)
    ALL = "all"  # a job for each time missed (the latest 1,000 at most)


_TIMES = {
    "run_at",
    "created_at",
    "updated_at",
    "completed_at",
    "lease_expires_at",
    "schedule_slot",
    "next_run_at",
    "last_run_at",
}
# The fields read as an enum, and their values; a value this client does not know yet stays a str.
_ENUMS: dict[str, dict[Any, StrEnum]] = {
    "status": {status.value: status for status in JobStatus},
    "catch_up": {catch_up.value: catch_up for catch_up in CatchUp},
}


# Per result dataclass, per field: its name, whether it is a time, its enum's values (None: no enum).
_PLANS: dict[type, tuple[tuple[str, bool, dict[Any, StrEnum] | None], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, bool, dict[Any, StrEnum] | None], ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple((f.name, f.name in _TIMES, _ENUMS.get(f.name)) for f in fields(cls))
    return plan


def load(cls: type[T], data: Mapping[str, Any]) -> T:
    """A result dataclass from an answer's JSON object: known fields only, RFC 3339 times parsed."""
    values = {}
    for name, is_time, choices in _plan(cls):
        if name in data:
            value = data[name]
            if is_time and isinstance(value, str):
                value = datetime.fromisoformat(value)
            elif choices is not None:
                value = choices.get(value, value)
            values[name] = value
    return cls(**values)


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    queue: str
    status: JobStatus
    payload: Any
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    dedup_key: str | None
    last_error: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    # Only in enqueue answers: True when dedup_key matched an active job, and this is that job.
    duplicate: bool = False
    # What the job is (send_email), as enqueued; None when none was given (or the service predates kinds).
    kind: str | None = None
    # What flow control groups it by (a tenant, a customer), as enqueued; None when none was given.
    key: str | None = None
    # What the worker's ack kept (any JSON value); None when none (or the service predates results).
    result: Any = None
    # What the worker last sent with an extend (any JSON value); None when none yet.
    progress: Any = None
    # The schedule that enqueued it, and the time it was enqueued for (None for a trigger, and for a
    # job no schedule enqueued).
    schedule: str | None = None
    schedule_slot: datetime | None = None
    # The worker_id its latest lease was taken with (the worker running it, or the last that did).
    worker_id: str | None = None
    # The W3C trace context it was enqueued under; None when none was given.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class LeasedJob:
    """A job this worker holds until `lease_expires_at`; ack, nack and extend need its `lease_token`."""

    id: int
    queue: str
    payload: Any
    priority: int
    attempts: int  # this lease included
    max_attempts: int
    run_at: datetime
    created_at: datetime
    last_error: str | None
    lease_token: str
    lease_expires_at: datetime
    kind: str | None = None  # as enqueued; None when none was given
    key: str | None = None  # as enqueued; None when none was given
    traceparent: str | None = None  # the W3C trace context it was enqueued under; None: none
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class AckResult:
    id: int
    status: JobStatus


@dataclass(frozen=True, slots=True)
class NackResult:
    id: int
    status: JobStatus  # pending (runs again at run_at) or dead
    run_at: datetime


@dataclass(frozen=True, slots=True)
class ExtendResult:
    id: int
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item of a batch ack: `ok`, or the `code` of the problem it met (lease_lost, not_found; for a
    result, payload_too_large or validation_error: nothing changed, the job is still held)."""

    id: int
    ok: bool
    code: str | None = None


@dataclass(frozen=True, slots=True)
class NackItemResult(ItemResult):
    """One item of a batch nack; `status` (pending or dead) and `run_at` when `ok`."""

    status: JobStatus | None = None
    run_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of jobs, newest first. A page of `client.admin.jobs` reads a bounded window of jobs, so with
    a rare filter it may be short, even empty, and still have a next page."""

    jobs: list[Job]
    next_before_id: int | None  # pass as before_id for the next page; None at the end


DeadPage = JobPage  # a page of dead jobs (`client.admin.dead_jobs`)


@dataclass(frozen=True, slots=True)
class RetryDeadResult:
    retried: int
    skipped: list[int] = field(default_factory=list)  # left dead: an active job holds their dedup_key


@dataclass(frozen=True, slots=True)
class PurgeResult:
    id: int
    purged: bool


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `limit` leases in any window of `period` seconds."""

    limit: int
    period: float


class NoLimit:
    """`NO_LIMIT`: what `client.admin.configure_queue` takes to remove a key concurrency or a rate."""

    def __repr__(self) -> str:
        return "NO_LIMIT"


NO_LIMIT = NoLimit()


@dataclass(frozen=True, slots=True)
class QueueSettings:
    visibility_timeout: float
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    retention: float
    # Flow control (None: no limit): jobs of one key running at once (1: also in order); jobs handed
    # out across keys in turn; leases of the queue, and of each key, per window.
    key_concurrency: int | None = None
    fair: bool = False
    rate: Rate | None = None
    key_rate: Rate | None = None


@dataclass(frozen=True, slots=True)
class DeleteKeyResult:
    queue: str
    key: str
    deleted: bool


@dataclass(frozen=True, slots=True)
class KeyView:
    """A key of a queue: its own limits (None: the queue's), and its jobs waiting and running."""

    queue: str
    key: str
    concurrency: int | None
    rate: Rate | None
    pending: int
    running: int


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    """A worker that leased in the last hour (by the `worker_id` it sends), or holds a running job."""

    worker_id: str
    queues: list[str]
    last_seen: datetime | None  # None: holds jobs, not seen leasing since it was forgotten
    leased: int  # jobs it leased while it has been kept
    held: int  # jobs running under its id now
    next_deadline: datetime | None  # the soonest lease deadline of the jobs it holds


@dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    pending: int  # ready now
    scheduled: int  # waiting for a future run_at
    running: int
    dead: int
    completed: int  # not yet pruned
    oldest_pending_age_seconds: float  # the lag: age of the oldest ready job
    paused: bool


@dataclass(frozen=True, slots=True)
class QueueDetail(QueueRow):
    settings: QueueSettings


@dataclass(frozen=True, slots=True)
class Schedule:
    """A job enqueued at each time `cron` names, in `timezone`: `payload` on `queue`, with `kind`,
    `priority` and `max_attempts` (None: the queue's)."""

    name: str
    cron: str  # 5 fields (minute precision), or 6 with a leading seconds field
    timezone: str  # an IANA name (Europe/Berlin); the service's default is UTC
    queue: str
    payload: Any
    kind: str | None
    priority: int
    max_attempts: int | None
    key: str | None  # kept with the schedule, for keyed flow control
    catch_up: CatchUp
    paused: bool
    next_run_at: datetime | None  # None while paused
    last_run_at: datetime | None  # the last time it enqueued (its slot, or when triggered)
    last_job_id: int | None  # the job it enqueued then
    created_at: datetime
    updated_at: datetime
    # Only in trigger answers: the job the trigger enqueued.
    job_id: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteScheduleResult:
    name: str
    deleted: bool
