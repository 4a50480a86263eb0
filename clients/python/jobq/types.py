"""What the jobq client answers with: the result dataclasses and the errors, one per problem `code`.

Import them from here (`from jobq.types import LeasedJob`); the errors an application catches most
(`JobqError`, `LeaseLost`, `NotFound`, `Conflict`, `Unavailable`, `ValidationError`) also from `jobq`.
Results are small frozen dataclasses read from the answers' JSON; fields the service adds later are
ignored, so an older client keeps working. `PushedJob`, the job a queue's push delivery sends to its
receiver, is a TypedDict instead: the request's JSON as it reads (`jobq.verify_push` returns it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, NotRequired, TypedDict, TypeVar

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


class PushVerificationError(ValueError):
    """A request to a push receiver that `jobq.verify_push` refused; its message says why: a header
    missing or malformed, a timestamp too far from now, no signature matching the secret, a secret not in
    `whsec_` form, a body that is not a JSON object. A receiver answers it with 401.

    A ValueError, not a JobqError: it is about a request that came in, not an answer of the service, and
    code that catches JobqError around calls to the service (the worker runner, the `jobq` command) must
    not take it for one."""


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


class RunIf(StrEnum):
    """What a job's parents (`depends_on`) must end as for it to run, once the last of them has ended;
    else it is cancelled. A str, like JobStatus."""

    COMPLETED = "completed"  # every parent completed (the default)
    FINISHED = "finished"  # whatever they ended as
    FAILED = "failed"  # one at least dead or cancelled: a job that cleans up after a failure


class WorkflowStatus(StrEnum):
    """A workflow's status, from its jobs'. A str, like JobStatus."""

    RUNNING = "running"  # any of its jobs may still run (waiting, pending or running)
    COMPLETED = "completed"  # every job completed
    FAILED = "failed"  # one at least dead, or cancelled because of a parent
    CANCELLED = "cancelled"  # by `cancel_workflow` (DELETE)


# The statuses a wait for a workflow ends on.
WORKFLOW_FINISHED = frozenset({WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED})


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
    "finished_at",
    "at",
    "until",
    "sleeping_until",
}
# The fields read as an enum, and their values; a value this client does not know yet stays a str.
_ENUMS: dict[str, dict[Any, StrEnum]] = {
    "status": {status.value: status for status in JobStatus},
    "catch_up": {catch_up.value: catch_up for catch_up in CatchUp},
    "run_if": {run_if.value: run_if for run_if in RunIf},
}


# Per result dataclass, per field: its name, whether it is a time, its enum's values (None: no enum), and
# how a value of it is read (None: as it is; `_READERS`).
_Plan = tuple[tuple[str, bool, dict[Any, StrEnum] | None, Callable[[Any], Any] | None], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        own = _READERS.get(cls, {})
        plan = _PLANS[cls] = tuple(
            (f.name, f.name in _TIMES, None if f.name in own else _ENUMS.get(f.name), own.get(f.name))
            for f in fields(cls)
        )
    return plan


def load(cls: type[T], data: Mapping[str, Any]) -> T:
    """A result dataclass from an answer's JSON object: known fields only, RFC 3339 times parsed, nested
    results read as theirs (a workflow's jobs, a leased job's parents)."""
    values = {}
    for name, is_time, choices, read in _plan(cls):
        if name in data:
            value = data[name]
            if read is not None:
                value = None if value is None else read(value)
            elif is_time and isinstance(value, str):
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
    # Its parents' ids, as enqueued (depends_on), and what they must end as for it to run (None: it has
    # no parents); the workflow that made it (None: none).
    depends_on: list[int] | None = None
    run_if: RunIf | None = None
    workflow_id: int | None = None
    # Only in answers of an enqueue with `debounce`: True when the key's pending job took this enqueue
    # (its payload replaced, its run_at moved), and this is that job.
    debounced: bool = False
    # Durable steps and events: the results its handler recorded, by step name; the events that reached
    # it (and its waits that ran out), in order; what it waits for (None unless waiting for an event);
    # until when it sleeps (None unless released to sleep). None: none.
    steps: dict[str, Any] | None = None
    events: list[Event] | None = None
    waiting_for: WaitingFor | None = None
    sleeping_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Debounce:
    """An enqueue's debounce (`enqueue(..., debounce=Debounce("user:7", 30))`): while a job of the queue
    with this `key` is still pending, an enqueue with the key lands in it (its payload replaced, its
    run_at moved to now + `seconds`, never past its first enqueue + `max_seconds`); otherwise a new job
    is made to run in `seconds`. So a burst of enqueues runs once, with the last payload, `seconds`
    after the burst ends."""

    key: str  # 1-256 characters, per queue
    seconds: float
    max_seconds: float | None = None  # None: a burst that never pauses moves the job for good


@dataclass(frozen=True, slots=True)
class Parent:
    """A parent of a job (one of its `depends_on`): its id, kind, status, and what its ack kept."""

    id: int
    kind: str | None
    status: JobStatus  # a leased child's parents have all ended
    result: Any = None  # None: none (or the parent is not completed)


@dataclass(frozen=True, slots=True)
class Event:
    """An event that reached a job (`POST /events`), or a wait of the job that ran out (`timed_out`, with
    no id and no payload): a leased job's `events`, in the order they came."""

    name: str
    at: datetime
    payload: Any = None
    id: int | None = None  # None for a wait that ran out
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class EventSent:
    """An event sent (`client.send_event`): its id, and how many jobs awaiting it it made pending."""

    id: int
    name: str
    woken: int


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of the events kept, newest first (`client.admin.events`)."""

    events: list[Event]
    next_before_id: int | None  # pass as before_id for the next page; None at the end


@dataclass(frozen=True, slots=True)
class Awaited:
    """A wait for an event begun (`client.worker.await_event`): `waiting` until the event (or `run_at`,
    its deadline), or `pending` at once with `event_id`, an event of that name sent since the job was
    enqueued."""

    id: int
    status: JobStatus
    run_at: datetime
    event_id: int | None = None


@dataclass(frozen=True, slots=True)
class WaitingFor:
    """What a waiting job waits for: an event's name, until when."""

    event: str
    until: datetime


@dataclass(frozen=True, slots=True)
class ParentPage:
    """A page of a job's parents, in id order (`client.job_parents`)."""

    parents: list[Parent]
    next_after_id: int | None  # pass as after_id for the next page; None at the end


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
    # Its parents, as the lease carries them for a job with 1-100 of them; None for a job with none, or
    # with more (a handler's `jobq.parents()` reads them either way).
    parents: list[Parent] | None = None
    # The results its handler recorded (`ctx.step`), by step name, and the events that reached it (and its
    # waits that ran out), in order; None when it has none.
    steps: dict[str, Any] | None = None
    events: list[Event] | None = None


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


@dataclass(frozen=True, slots=True)
class WorkflowJobMade:
    """A job of a workflow just made: its ref, its id, and its status (pending, or waiting for parents)."""

    ref: str
    id: int
    status: JobStatus


@dataclass(frozen=True, slots=True)
class WorkflowMade:
    """A workflow just made (`client.create_workflow`, `Flow.submit`): its id, and its jobs' ids by ref."""

    id: int
    name: str | None
    status: WorkflowStatus  # running, unless every job ended at once
    created_at: datetime
    jobs: list[WorkflowJobMade]  # in the request's order

    @property
    def ids(self) -> dict[str, int]:
        """Each job's id, by its ref."""
        return {job.ref: job.id for job in self.jobs}


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    """A job of a workflow as it is now: its parents named by their refs (and by their ids, for parents
    outside the workflow)."""

    ref: str
    id: int
    queue: str
    kind: str | None
    status: JobStatus
    depends_on: list[str | int]


@dataclass(frozen=True, slots=True)
class Workflow:
    """A workflow (`client.get_workflow`): its status, how many of its jobs are in each status, and its
    jobs in the order they were made (those pruned by their queue's retention left out)."""

    id: int
    name: str | None
    status: WorkflowStatus
    created_at: datetime
    finished_at: datetime | None  # when its last job ended; None while running
    counts: dict[str, int]  # job status: how many
    jobs: list[WorkflowJob]

    @property
    def ids(self) -> dict[str, int]:
        """Each job's id, by its ref."""
        return {job.ref: job.id for job in self.jobs}

    def job(self, ref: str) -> WorkflowJob:
        """Its job named `ref`; KeyError when it has none of that name."""
        for job in self.jobs:
            if job.ref == ref:
                return job
        raise KeyError(ref)


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """A workflow in a list (`client.workflows`): its status as the service last saw it."""

    id: int
    name: str | None
    status: WorkflowStatus
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    """A page of workflows, newest first."""

    workflows: list[WorkflowRow]
    next_before_id: int | None  # pass as before_id for the next page; None at the end


# --- push delivery ---------------------------------------------------------------------------------


class PushedParent(TypedDict):
    """A parent of a pushed job, as the request's body carries it."""

    id: int
    kind: str | None
    status: str  # a JobStatus value: completed, dead or cancelled (a pushed job's parents have all ended)
    result: Any  # what its ack kept; None: none (or the parent is not completed)


class PushedJob(TypedDict):
    """A job as push delivery sends it to a queue's push URL: the request's JSON body, as it reads (times
    are ISO 8601 strings), which `jobq.verify_push` returns once its signature checks out."""

    id: int
    queue: str
    kind: str | None  # as enqueued; None when none was given
    key: str | None  # as enqueued; None when none was given
    payload: Any
    attempts: int
    max_attempts: int
    run_at: str
    created_at: str
    parents: NotRequired[list[PushedParent]]  # only for a job with parents (depends_on)


def _list_of(cls: type[T]) -> Callable[[Any], list[T]]:
    return lambda items: [load(cls, item) for item in items]


def _enum(cls: type[StrEnum]) -> Callable[[Any], Any]:
    choices = {member.value: member for member in cls}
    return lambda value: choices.get(value, value)


_WORKFLOW_STATUS = _enum(WorkflowStatus)
# Fields read otherwise than by their name's rule (`load`): nested results, and a workflow's `status`,
# which is a WorkflowStatus where every other `status` is a JobStatus.
_READERS: dict[type, dict[str, Callable[[Any], Any]]] = {
    LeasedJob: {"parents": _list_of(Parent), "events": _list_of(Event)},
    Job: {"events": _list_of(Event), "waiting_for": lambda value: load(WaitingFor, value)},
    EventPage: {"events": _list_of(Event)},
    ParentPage: {"parents": _list_of(Parent)},
    WorkflowMade: {"status": _WORKFLOW_STATUS, "jobs": _list_of(WorkflowJobMade)},
    Workflow: {"status": _WORKFLOW_STATUS, "jobs": _list_of(WorkflowJob)},
    WorkflowRow: {"status": _WORKFLOW_STATUS},
    WorkflowPage: {"workflows": _list_of(WorkflowRow)},
}
