"""Request and response bodies of the HTTP API (pydantic), separate from the tables.

Limits live here, next to the fields they bound, so the OpenAPI document states them too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from app.cron import Cron
from app.models import (
    KIND_PATTERN,
    MAX_JOB_ID,
    MAX_KEY,
    MAX_KIND,
    MAX_LEASE_TOKEN,
    MAX_QUEUE_NAME,
    MAX_TRACESTATE,
    MAX_VISIBILITY_TIMEOUT,
    QUEUE_NAME_PATTERN,
    TRACEPARENT_PATTERN,
    CatchUp,
    JobStatus,
)

QueueName = Annotated[
    str, Field(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=MAX_QUEUE_NAME, examples=["emails"])
]


def _json_number(value: Any) -> Any:
    # JSON numbers only: 2.0 is the integer 2 (as in JSON Schema), but "2" and true are not numbers.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number")
    return value


def _json_string(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be a string (RFC 3339)")
    return value


# With strict=False on an int, a whole float (2.0) becomes 2; Number refuses everything else lax mode
# would convert ("2", true).
Number = BeforeValidator(_json_number)

# Limits of the bodies' fields, named once: app/fast_bodies.py reads the same bodies with the same limits.
MAX_DELAY = 10 * 365 * 86400  # seconds
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1  # PostgreSQL's integer
MAX_MAX_ATTEMPTS = 1000
MAX_DEDUP_KEY = 512
MAX_BATCH = 1000  # jobs of a batch enqueue, items of a batch ack, nack or release

# A run_at is a time from 1970 to the last day of year 9999: the ends of Python's datetime range are what
# asyncpg writes as PostgreSQL's -infinity and infinity, which no answer could show (revision 0017).
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(9999, 12, 31, tzinfo=UTC)


def _run_at_in_range(value: datetime) -> datetime:
    if value < EARLIEST_RUN_AT:
        raise ValueError("must be 1970-01-01T00:00:00Z or later (any past time runs the job now)")
    if value > LATEST_RUN_AT:
        raise ValueError("must be 9999-12-31T00:00:00Z or earlier")
    return value


RunAt = Annotated[AwareDatetime, BeforeValidator(_json_string), AfterValidator(_run_at_in_range)]

# Constraints first, then the validator, so the constraints reach the JSON schema as minimum/maximum.
JobId = Annotated[int, Field(strict=False, ge=1, le=MAX_JOB_ID), Number]
Seconds = Annotated[float, Field(ge=0, le=MAX_DELAY, allow_inf_nan=False), Number]
LeaseSeconds = Annotated[float, Field(gt=0, le=MAX_VISIBILITY_TIMEOUT, allow_inf_nan=False), Number]
Priority = Annotated[
    int, Field(strict=False, ge=MIN_PRIORITY, le=MAX_PRIORITY, description="Lower runs first."), Number
]
MaxAttempts = Annotated[int, Field(strict=False, ge=1, le=MAX_MAX_ATTEMPTS), Number]
DedupKey = Annotated[str, Field(min_length=1, max_length=MAX_DEDUP_KEY)]
Kind = Annotated[
    str,
    Field(
        pattern=KIND_PATTERN,
        min_length=1,
        max_length=MAX_KIND,
        description="What the job is, for workers to route it by: 1-128 of A-Z a-z 0-9 _ . : -",
        examples=["send_email"],
    ),
]
JobKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_KEY,
        description="What flow control groups the job by (a tenant, a customer, an SQS MessageGroupId): "
        "1-256 characters.",
        examples=["customer-42"],
    ),
]
LeaseToken = Annotated[
    str, Field(min_length=1, max_length=MAX_LEASE_TOKEN, description="Opaque; from /lease.")
]


class Body(BaseModel):
    # Strict: a request says what the document says (a number is a number, not "5"; true is not 1),
    # and unknown fields are refused rather than silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


# --- producers -------------------------------------------------------------------------------------


def _traceparent(value: str) -> str:
    """A traceparent that names a trace: W3C forbids version ff and all-zero trace and parent ids."""
    version, trace_id, parent_id, _ = value.split("-")
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        raise ValueError(
            "a traceparent of version ff, or with an all-zero trace or parent id, names no trace"
        )
    return value


# The schema says all of it in one pattern, with lookaheads (which pydantic's own regex engine lacks, so
# it checks the simple pattern and then _traceparent).
TraceParent = Annotated[
    str,
    Field(
        pattern=TRACEPARENT_PATTERN,
        json_schema_extra={
            "pattern": "^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"
        },
    ),
    AfterValidator(_traceparent),
]
# Printable ASCII, as its list members are.
TraceState = Annotated[str, Field(min_length=1, max_length=MAX_TRACESTATE, pattern=r"^[ -~]+$")]
_TRACEPARENT: TypeAdapter[str] = TypeAdapter(TraceParent)
_TRACESTATE: TypeAdapter[str] = TypeAdapter(TraceState)


def _valid(adapter: TypeAdapter[str], value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return adapter.validate_python(value.strip())
    except ValidationError:
        return None


def trace_context(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """A trace context given beside a job rather than in its fields (a request's headers, an SQS message
    attribute), taken as W3C Trace Context asks: an invalid traceparent is ignored, and the tracestate
    with it; an invalid tracestate alone is dropped. (None, None) when there is none to take."""
    parent = _valid(_TRACEPARENT, traceparent)
    return (None, None) if parent is None else (parent, _valid(_TRACESTATE, tracestate))


class EnqueueRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["run_at", "delay"]},
            # A tracestate (not null) needs a traceparent (not null).
            "if": {"required": ["tracestate"], "properties": {"tracestate": {"type": "string"}}},
            "then": {"required": ["traceparent"], "properties": {"traceparent": {"type": "string"}}},
        }
    )

    queue: QueueName
    # Any: the service only stores the payload, so it is not walked and validated value by value.
    # Required without a default, and null is a valid payload.
    payload: Any = Field(description="Any JSON value, null included; at most max_payload_bytes encoded.")
    priority: Priority = 0
    run_at: RunAt | None = Field(
        default=None,
        strict=False,
        description="Not before this time (RFC 3339, with its offset), from 1970-01-01T00:00:00Z to"
        " 9999-12-31T00:00:00Z.",
    )
    delay: Seconds | None = Field(default=None, description="Not before now + delay seconds.")
    max_attempts: MaxAttempts | None = Field(default=None, description="Default: the queue's setting.")
    dedup_key: DedupKey | None = None
    kind: Kind | None = None
    key: JobKey | None = None
    traceparent: TraceParent | None = Field(
        default=None,
        description="The W3C trace context (traceparent) the job is part of, kept with it and handed to its"
        " workers; default: the request's `traceparent` header, if any. Version 00 as written, lower case.",
        examples=["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
    )
    tracestate: TraceState | None = Field(
        default=None, description="The W3C tracestate that goes with `traceparent` (never without it)."
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> EnqueueRequest:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.tracestate is not None and self.traceparent is None:
            raise ValueError("tracestate goes with a traceparent: give both, or neither")
        return self


class EnqueueBatchRequest(Body):
    jobs: list[EnqueueRequest] = Field(min_length=1, max_length=MAX_BATCH)


class Job(BaseModel):
    id: int
    queue: str
    kind: str | None = Field(description="As enqueued; null when none was given.")
    key: str | None = Field(default=None, description="As enqueued; null when none was given.")
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
    result: Any = Field(description="What the ack kept (any JSON value); null when none.")
    progress: Any = Field(description="What the latest extend sent as `progress`; null when none.")
    schedule: str | None = Field(default=None, description="The schedule that enqueued it; null: none.")
    schedule_slot: datetime | None = Field(
        default=None, description="The cron slot it was enqueued for; null for a trigger or no schedule."
    )
    worker_id: str | None = Field(
        default=None,
        description="The worker_id its latest lease was taken with (the worker running it, or the last "
        "one that did); null when never leased, leased without one, or released.",
    )
    traceparent: str | None = Field(default=None, description="The trace context it was enqueued under.")
    tracestate: str | None = Field(default=None, description="With traceparent, as enqueued.")


class EnqueuedJob(Job):
    duplicate: bool = Field(description="True when dedup_key matched an active job; this is that job.")


class EnqueueBatchResponse(BaseModel):
    jobs: list[EnqueuedJob]


# --- workers ---------------------------------------------------------------------------------------


class LeaseRequest(Body):
    queue: QueueName
    max_jobs: Annotated[int, Field(strict=False, ge=1, le=1000), Number] = 1
    visibility_timeout: LeaseSeconds | None = Field(default=None, description="Default: the queue's.")
    wait: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False), Number] = 0
    worker_id: Annotated[str, Field(max_length=128)] | None = None


class LeasedJob(BaseModel):
    id: int
    queue: str
    kind: str | None = Field(description="As enqueued; null when none was given.")
    key: str | None = Field(default=None, description="As enqueued; null when none was given.")
    payload: Any
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    last_error: str | None
    lease_token: str
    lease_expires_at: datetime
    traceparent: str | None = Field(default=None, description="The trace context it was enqueued under.")
    tracestate: str | None = Field(default=None, description="With traceparent, as enqueued.")


class LeaseResponse(BaseModel):
    jobs: list[LeasedJob]


class JobLeaseItem(Body):
    """A job and the lease token it is held under: an item of /release."""

    id: JobId
    lease_token: LeaseToken


class AckRequest(JobLeaseItem):
    # Any: like a payload, stored as it is, not walked value by value. JSON null is no result.
    result: Any = Field(
        default=None,
        description="What the job produced: any JSON value, kept with the job for the queue's retention;"
        " at most max_result_bytes encoded (larger is 413, and the job stays running). Null: none.",
    )


class AckResponse(BaseModel):
    id: int
    status: JobStatus


class NackRequest(Body):
    id: JobId
    lease_token: LeaseToken
    error: str | None = Field(default=None, description="Kept as last_error; long texts are cut.")
    retry_after: Seconds | None = Field(default=None, description="Default: the queue's backoff.")
    dead: bool = False


class NackResponse(BaseModel):
    id: int
    status: JobStatus
    run_at: datetime


class ExtendRequest(Body):
    id: JobId
    lease_token: LeaseToken
    visibility_timeout: LeaseSeconds
    progress: Any = Field(
        default=None,
        description="How far the job got: any JSON value, shown on the job until the next one;"
        " at most max_result_bytes encoded (larger is 413, nothing changes). Null: keep the last one.",
    )


class ExtendResponse(BaseModel):
    id: int
    lease_expires_at: datetime


class AckBatchRequest(Body):
    items: list[AckRequest] = Field(min_length=1, max_length=MAX_BATCH)


class ReleaseRequest(Body):
    items: list[JobLeaseItem] = Field(min_length=1, max_length=MAX_BATCH)


class NackBatchRequest(Body):
    items: list[NackRequest] = Field(min_length=1, max_length=MAX_BATCH)


class ItemResult(BaseModel):
    id: int
    ok: bool
    code: str | None = Field(
        default=None,
        description="Why not, when not ok: lease_lost or not_found; for an ack's result, payload_too_large"
        " or validation_error (nothing changed).",
    )


class BatchResults(BaseModel):
    results: list[ItemResult]


class NackItemResult(ItemResult):
    status: JobStatus | None = Field(default=None, description="pending or dead, when ok.")
    run_at: datetime | None = Field(default=None, description="When it runs again, when ok.")


class NackBatchResults(BaseModel):
    results: list[NackItemResult]


# --- operators -------------------------------------------------------------------------------------


class DeadPage(BaseModel):
    jobs: list[Job]
    next_before_id: int | None = Field(description="Pass as before_id for the next page; null at the end.")


class JobPage(BaseModel):
    jobs: list[Job]
    next_before_id: int | None = Field(
        description="Pass as before_id for the next page; null once nothing older is left. A page reads at "
        "most 10,000 jobs of its queue and status, so with a rare kind, key or search it may come back "
        "short, even empty, and still have a next page."
    )


class RetryDeadRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["ids"], "properties": {"ids": {"type": "array"}}},
                {"required": ["queue"], "properties": {"queue": {"type": "string"}}},
            ]
        }
    )

    ids: list[JobId] | None = Field(default=None, min_length=1, max_length=1000)
    queue: QueueName | None = None

    @model_validator(mode="after")
    def _something(self) -> RetryDeadRequest:
        if self.ids is None and self.queue is None:
            raise ValueError("give ids or queue")
        return self


class RetryDeadResponse(BaseModel):
    retried: int
    skipped: list[int] = Field(description="Dead jobs left dead: an active job holds their dedup_key.")


class PurgeResponse(BaseModel):
    id: int
    purged: bool


MAX_KEY_CONCURRENCY = 100_000
MAX_RATE_PERIOD = 86400.0  # a rate's window, at most a day
KeyConcurrency = Annotated[
    int,
    Field(strict=False, ge=1, le=MAX_KEY_CONCURRENCY, description="Jobs of one key running at once."),
    Number,
]


class Rate(Body):
    """At most `limit` leases in any window of `period` seconds."""

    limit: Annotated[int, Field(strict=False, ge=1, le=1_000_000), Number]
    period: Annotated[float, Field(gt=0, le=MAX_RATE_PERIOD, allow_inf_nan=False), Number] = Field(
        description="Seconds, at most a day."
    )


class QueueSettings(BaseModel):
    visibility_timeout: float
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    retention: float
    key_concurrency: int | None = Field(
        description="At most this many jobs of one key running at once; 1 also runs a key's jobs in order. "
        "null: no limit."
    )
    fair: bool = Field(description="Ready jobs are handed out across keys in turn.")
    rate: Rate | None = Field(description="At most `limit` leases of the queue per `period`; null: none.")
    key_rate: Rate | None = Field(description="At most `limit` leases of each key per `period`; null: none.")


# The flow-control settings of a PATCH: a null clears one, an absent one stays as it is.
FLOW_SETTINGS = ("key_concurrency", "fair", "rate", "key_rate")


class QueueSettingsPatch(Body):
    visibility_timeout: LeaseSeconds | None = None
    max_attempts: MaxAttempts | None = None
    backoff_base: Seconds | None = None
    backoff_cap: Seconds | None = None
    retention: Seconds | None = None
    key_concurrency: KeyConcurrency | None = Field(
        default=None, description="null removes the limit; absent keeps it."
    )
    fair: bool | None = Field(default=None, description="null is false; absent keeps it.")
    rate: Rate | None = Field(default=None, description="null removes the limit; absent keeps it.")
    key_rate: Rate | None = Field(default=None, description="null removes the limit; absent keeps it.")

    @property
    def flow(self) -> dict[str, object]:
        """The flow-control settings this patch changes, as CONFIGURE_FLOW takes them."""
        return {name: _plain(getattr(self, name)) for name in FLOW_SETTINGS if name in self.model_fields_set}


def _plain(value: object) -> object:
    return value.model_dump() if isinstance(value, BaseModel) else value


class KeyOverrides(Body):
    """A key's own limits, in place of the queue's key_concurrency and key_rate (null: the queue's)."""

    concurrency: KeyConcurrency | None = None
    rate: Rate | None = None


class KeyView(BaseModel):
    queue: str
    key: str
    concurrency: int | None = Field(description="The key's own concurrency; null: the queue's.")
    rate: Rate | None = Field(description="The key's own rate; null: the queue's key_rate.")
    pending: int = Field(description="Jobs of the key waiting (ready or scheduled).")
    running: int


class WorkerView(BaseModel):
    worker_id: str = Field(description="As sent with POST /lease (the Python runner sends host:pid).")
    queues: list[str] = Field(description="The queues it leased from, or holds jobs of.")
    last_seen: datetime | None = Field(
        description="Its last lease call, as the replicas last wrote it (every few seconds); null for a "
        "worker that holds jobs but has not been seen leasing since it was forgotten."
    )
    leased: int = Field(description="Jobs it leased while it has been kept (seen in the last hour).")
    held: int = Field(description="Jobs running under its id now.")
    next_deadline: datetime | None = Field(description="The soonest lease deadline of the jobs it holds.")


class WorkerList(BaseModel):
    workers: list[WorkerView] = Field(description="Most recently seen first; at most 500.")


class KeyList(BaseModel):
    keys: list[KeyView] = Field(description="Keys with most jobs waiting first, then those with overrides.")


class DeletedKey(BaseModel):
    queue: str
    key: str
    deleted: bool


class QueueRow(BaseModel):
    queue: str
    pending: int = Field(description="Ready now (run_at <= now).")
    scheduled: int = Field(description="Waiting for a future run_at.")
    running: int
    dead: int
    completed: int = Field(description="Not yet pruned.")
    oldest_pending_age_seconds: float = Field(description="Age of the oldest ready job (lag); 0 if none.")
    paused: bool


class QueueDetail(QueueRow):
    settings: QueueSettings


class Health(BaseModel):
    status: str


class HorizonHolder(BaseModel):
    holder: str = Field(description="session, replication_slot or prepared_transaction.")
    pid: int | None = Field(description="The session's process id (a slot's: of its walsender, if active).")
    name: str | None = Field(description="The session's application_name, the slot's name, or the gid.")
    state: str | None = Field(description="The session's state (e.g. idle in transaction), or the slot's.")
    seconds: float | None = Field(description="How long its transaction has been open (null: no such time).")
    xid_age: int = Field(description="How many transactions old its xmin is.")
    query: str | None = Field(description="The session's last statement, cut at 200 characters.")


class JobsTableHealth(BaseModel):
    live_tuples: int
    dead_tuples: int = Field(description="Rows dead and not yet vacuumed (statistics estimate).")
    bytes: int = Field(description="The jobs table's heap.")
    claim_index_bytes: int
    since_vacuum_seconds: float | None = Field(description="Since its last vacuum; null: none recorded.")


class DatabaseHealth(BaseModel):
    as_of: datetime | None = Field(description="When this replica last read it (every metrics interval).")
    oldest_snapshot: HorizonHolder | None = Field(
        description="What holds back vacuum of jobq's tables furthest: the oldest xmin in the database."
    )
    holding_back: bool = Field(description="Open a minute or more (a slot: 1,000,000 transactions).")
    jobs_table: JobsTableHealth | None


class Readiness(BaseModel):
    ready: bool
    database: bool
    schema_revision: str | None
    # This build's head revision: the schema may be at it or at a newer, compatible one.
    expected_revision: str
    # Whether this build can run on the schema (null while the database is unreachable).
    compatible: bool | None = None
    # The oldest code revision the schema runs, as its migration recorded it (null if unknown).
    compatible_from: str | None = None
    # Details only: readiness does not depend on them.
    database_health: DatabaseHealth | None = None


# --- schedules -------------------------------------------------------------------------------------


class ScheduleRequest(Body):
    cron: str = Field(
        min_length=1,
        max_length=256,
        description="Five fields (minute hour day month weekday), or six with a leading seconds field.",
        examples=["0 3 * * *"],
    )
    timezone: str = Field(
        default="UTC", min_length=1, max_length=64, description="IANA time zone the cron is read in."
    )
    queue: QueueName
    payload: Any = Field(description="The payload of each job it enqueues; any JSON value, null included.")
    kind: Kind | None = None
    priority: Priority = 0
    max_attempts: MaxAttempts | None = Field(default=None, description="Default: the queue's setting.")
    key: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Kept with the schedule, for keyed flow control."
    )
    catch_up: CatchUp = Field(
        default=CatchUp.ONCE,
        strict=False,  # the enum from its JSON string
        description="Slots missed by more than JOBQ_SCHEDULE_GRACE: skip (none), once (one job), "
        "all (one per slot, the latest 1,000).",
    )
    paused: bool = False

    @model_validator(mode="after")
    def _cron_and_timezone(self) -> ScheduleRequest:
        Cron(self.cron, self.timezone)  # a CronError (a ValueError) says what is wrong
        return self


class Schedule(BaseModel):
    name: str
    cron: str
    timezone: str
    queue: str
    payload: Any
    kind: str | None
    priority: int
    max_attempts: int | None
    key: str | None
    catch_up: CatchUp
    paused: bool
    next_run_at: datetime | None = Field(description="The next slot; null while paused.")
    last_run_at: datetime | None = Field(description="The last slot fired, or the last trigger.")
    last_job_id: int | None = Field(description="The job the last slot or trigger enqueued.")
    created_at: datetime
    updated_at: datetime


class TriggeredSchedule(Schedule):
    job_id: int = Field(description="The job the trigger enqueued.")


class ScheduleList(BaseModel):
    schedules: list[Schedule]


class DeletedSchedule(BaseModel):
    name: str
    deleted: bool
