"""Request and response bodies of the HTTP API (pydantic), separate from the tables.

Limits live here, next to the fields they bound, so the OpenAPI document states them too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

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

from app.core.cron import Cron
from app.core.jsontext import HugeNumber
from app.core.limits import (
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
)
from app.core.states import JobStatus
from app.db.tables import CatchUp
from app.http.problems import ProblemCode

QueueName = Annotated[
    str, Field(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=MAX_QUEUE_NAME, examples=["emails"])
]


def _json_number(value: Any) -> Any:
    # JSON numbers only: 2.0 is the integer 2 (as in JSON Schema), but "2" and true are not numbers.
    if type(value) is Decimal or type(value) is HugeNumber:  # app/core/jsontext.py read_json
        return float(value)
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

# Limits of the bodies' fields, named once: app/http/fastpath/bodies.py reads the same bodies with the same
# limits.
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
        examples=["send_email"],
    ),
]
JobKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_KEY,
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


# Examples for the document: bodies as a client sends them, answers as the service writes them.
_PAYLOAD = {"to": "ada@example.com", "template": "welcome"}
_TOKEN = "3f2b8c1e-5a4d-4e7b-9c0a-1d2e3f4a5b6c.emails"
_TOKEN_2 = "9a0c7d4e-21b3-4f6a-8e5d-7c1b2a3f4e5d.emails"
_EXAMPLE_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_ENQUEUE_EXAMPLES = [
    {"queue": "emails", "payload": _PAYLOAD},
    {
        "queue": "emails",
        "payload": _PAYLOAD,
        "kind": "send_email",
        "key": "customer-42",
        "priority": -10,
        "delay": 60,
        "max_attempts": 3,
        "dedup_key": "welcome:ada@example.com",
    },
    {
        "queue": "reports",
        "payload": {"period": "day"},
        "kind": "build_report",
        "run_at": "2025-07-01T03:00:00+02:00",
    },
]


class EnqueueRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["run_at", "delay"]},
            # A tracestate (not null) needs a traceparent (not null).
            "if": {"required": ["tracestate"], "properties": {"tracestate": {"type": "string"}}},
            "then": {"required": ["traceparent"], "properties": {"traceparent": {"type": "string"}}},
            "examples": _ENQUEUE_EXAMPLES,
        }
    )

    queue: QueueName = Field(
        description="The queue to put the job in: 1-128 of A-Z a-z 0-9 _ . : - (created with its first job)."
    )
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
    dedup_key: DedupKey | None = Field(
        default=None,
        description="1-512 characters. While a pending or running job of the queue has it, enqueueing "
        "another answers that job (200, duplicate: true) instead; in a batch, a repeat is its first "
        "occurrence. Null: none.",
    )
    kind: Kind | None = Field(
        default=None,
        description="What the job is, for workers to route it by: 1-128 of A-Z a-z 0-9 _ . : -; the "
        "service only stores and shows it. Null: none.",
    )
    key: JobKey | None = Field(
        default=None,
        description="What flow control groups the job by (a tenant, a customer, an SQS MessageGroupId): "
        "1-256 characters. Null: none.",
    )
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
    model_config = ConfigDict(json_schema_extra={"examples": [{"jobs": _ENQUEUE_EXAMPLES[:2]}]})

    jobs: list[EnqueueRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1-1000 jobs, each as POST /jobs takes it: all are enqueued, or none.",
    )


_JOB_EXAMPLE = {
    "id": 1042,
    "queue": "emails",
    "kind": "send_email",
    "key": "customer-42",
    "status": "completed",
    "payload": _PAYLOAD,
    "priority": 0,
    "run_at": "2025-06-30T09:15:02.418211Z",
    "attempts": 1,
    "max_attempts": 5,
    "dedup_key": "welcome:ada@example.com",
    "last_error": None,
    "lease_expires_at": None,
    "created_at": "2025-06-30T09:15:02.418211Z",
    "updated_at": "2025-06-30T09:15:03.120877Z",
    "completed_at": "2025-06-30T09:15:03.120877Z",
    "result": {"message_id": "<1042@mail.example.com>"},
    "progress": None,
    "schedule": None,
    "schedule_slot": None,
    "worker_id": "mailer-1:4121",
    "traceparent": _EXAMPLE_TRACEPARENT,
    "tracestate": None,
}
_DEAD_JOB_EXAMPLE = _JOB_EXAMPLE | {
    "id": 1043,
    "status": "dead",
    "payload": {"to": "nobody@invalid", "template": "welcome"},
    "attempts": 5,
    "dedup_key": None,
    "last_error": "mailbox does not exist",
    "run_at": "2025-06-30T09:31:40.006125Z",
    "updated_at": "2025-06-30T10:02:11.774310Z",
    "completed_at": None,
    "result": None,
    "traceparent": None,
}


class Job(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_JOB_EXAMPLE, _DEAD_JOB_EXAMPLE]})

    id: int = Field(description="The job's id: an integer below 2^53.")
    queue: str = Field(description="The queue it is in.")
    kind: str | None = Field(description="As enqueued; null when none was given.")
    key: str | None = Field(default=None, description="As enqueued; null when none was given.")
    status: JobStatus = Field(
        description="pending (waiting to run, now or at its run_at), running (leased), completed, dead "
        "(out of attempts, or nacked as dead; kept until retried or purged) or cancelled."
    )
    payload: Any = Field(description="As enqueued: any JSON value, null included.")
    priority: int = Field(description="Lower runs first.")
    run_at: datetime = Field(
        description="Not leased before this time: as enqueued, or as a nack's retry, a dead retry or "
        "POST /jobs/{id}/run set it."
    )
    attempts: int = Field(
        description="Leases so far (a release gives its attempt back); 0 again after a dead retry."
    )
    max_attempts: int = Field(
        description="Leases it gets before it goes dead: its own, else its queue's setting as it is now."
    )
    dedup_key: str | None = Field(description="As enqueued; null when none was given.")
    last_error: str | None = Field(
        description="Why its latest attempt failed: the latest nack's error (null if it sent none), or the "
        "expired lease's deadline, attempt and worker. Null until an attempt fails."
    )
    lease_expires_at: datetime | None = Field(
        description="The deadline of its lease while running; null otherwise."
    )
    created_at: datetime = Field(description="When it was enqueued.")
    updated_at: datetime = Field(
        description="When it last changed (a lease, extend, ack, nack, release, expiry or retry)."
    )
    completed_at: datetime | None = Field(
        description="When it was completed or cancelled (its queue's retention counts from then); null "
        "otherwise."
    )
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


_ENQUEUED_EXAMPLE = _JOB_EXAMPLE | {
    "status": "pending",
    "run_at": "2025-06-30T09:16:02.418211Z",
    "attempts": 0,
    "priority": -10,
    "max_attempts": 3,
    "updated_at": "2025-06-30T09:15:02.418211Z",
    "completed_at": None,
    "result": None,
    "worker_id": None,
    "duplicate": False,
}


class EnqueuedJob(Job):
    model_config = ConfigDict(json_schema_extra={"examples": [_ENQUEUED_EXAMPLE]})

    duplicate: bool = Field(description="True when dedup_key matched an active job; this is that job.")


class EnqueueBatchResponse(BaseModel):
    jobs: list[EnqueuedJob] = Field(description="The jobs, in request order.")


# --- workers ---------------------------------------------------------------------------------------


class LeaseRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"queue": "emails", "max_jobs": 10, "wait": 20, "worker_id": "mailer-1:4121"},
                {"queue": "reports", "visibility_timeout": 600},
            ]
        }
    )

    queue: QueueName = Field(description="The queue to lease from (a paused queue leases nothing).")
    max_jobs: Annotated[int, Field(strict=False, ge=1, le=1000), Number] = Field(
        default=1, description="At most this many jobs: 1-1000."
    )
    visibility_timeout: LeaseSeconds | None = Field(
        default=None, description="Seconds each lease lasts, at most 43,200 (12 h). Default: the queue's."
    )
    wait: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False), Number] = Field(
        default=0,
        description="Seconds to long-poll, 0-60, while no job is ready: the call answers as soon as one "
        "is, or with no jobs when the wait runs out. 0: answer at once.",
    )
    worker_id: Annotated[str, Field(max_length=128)] | None = Field(
        default=None,
        description="Names the worker (at most 128 characters; the Python runner sends host:pid): kept on "
        "the jobs it leases, named in an expired lease's last_error, listed by GET /workers. Null: unnamed.",
    )


_LEASED_EXAMPLE = {
    "id": 1043,
    "queue": "emails",
    "kind": "send_email",
    "key": "customer-42",
    "payload": {"to": "grace@example.com", "template": "welcome"},
    "priority": 0,
    "attempts": 2,
    "max_attempts": 5,
    "run_at": "2025-06-30T09:16:40.006125Z",
    "created_at": "2025-06-30T09:15:05.230019Z",
    "last_error": "SMTP 451 4.7.1: try again later",
    "lease_token": _TOKEN,
    "lease_expires_at": "2025-06-30T09:17:11.291734Z",
    "traceparent": _EXAMPLE_TRACEPARENT,
    "tracestate": None,
}


class LeasedJob(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_LEASED_EXAMPLE]})

    id: int = Field(description="The job's id.")
    queue: str = Field(description="The queue it was leased from.")
    kind: str | None = Field(description="As enqueued; null when none was given.")
    key: str | None = Field(default=None, description="As enqueued; null when none was given.")
    payload: Any = Field(description="As enqueued: any JSON value, null included.")
    priority: int = Field(description="Lower runs first.")
    attempts: int = Field(description="Leases so far, this one included.")
    max_attempts: int = Field(
        description="Leases it gets before it goes dead: its own, else its queue's setting."
    )
    run_at: datetime = Field(description="When it became due: as enqueued, or when its retry was.")
    created_at: datetime = Field(description="When it was enqueued.")
    last_error: str | None = Field(description="Why an earlier attempt failed, as on the job; null: none.")
    lease_token: str = Field(
        description="This lease's token, opaque: ack, nack, extend and release need it, and another lease "
        "of the job makes it stale (409 lease_lost)."
    )
    lease_expires_at: datetime = Field(
        description="The lease's deadline (now + visibility_timeout): past it the job goes back to pending, "
        "or dead when out of attempts, as a failed attempt. POST /extend moves it."
    )
    traceparent: str | None = Field(default=None, description="The trace context it was enqueued under.")
    tracestate: str | None = Field(default=None, description="With traceparent, as enqueued.")


class LeaseResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"jobs": [_LEASED_EXAMPLE]}, {"jobs": []}]})

    jobs: list[LeasedJob] = Field(
        description="The jobs leased, at most max_jobs; empty when none was ready before `wait` ran out."
    )


class JobLeaseItem(Body):
    """A job and the lease token it is held under: an item of /release."""

    id: JobId = Field(description="The leased job's id.")
    lease_token: LeaseToken


class AckRequest(JobLeaseItem):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": 1043, "lease_token": _TOKEN},
                {"id": 1043, "lease_token": _TOKEN, "result": {"message_id": "<1043@mail.example.com>"}},
            ]
        }
    )

    # Any: like a payload, stored as it is, not walked value by value. JSON null is no result.
    result: Any = Field(
        default=None,
        description="What the job produced: any JSON value, kept with the job for the queue's retention;"
        " at most max_result_bytes encoded (larger is 413, and the job stays running). Null: none.",
    )


class AckResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 1043, "status": "completed"}]})

    id: int = Field(description="The job acked.")
    status: JobStatus = Field(description="completed.")


class NackRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": 1043, "lease_token": _TOKEN, "error": "SMTP 451 4.7.1: try again later"},
                {
                    "id": 1043,
                    "lease_token": _TOKEN,
                    "error": "rate limited by the provider",
                    "retry_after": 300,
                },
                {"id": 1043, "lease_token": _TOKEN, "error": "mailbox does not exist", "dead": True},
            ]
        }
    )

    id: JobId = Field(description="The leased job's id.")
    lease_token: LeaseToken
    error: str | None = Field(default=None, description="Kept as last_error; long texts are cut.")
    retry_after: Seconds | None = Field(
        default=None, description="Seconds until it runs again (0 to 10 years). Default: the queue's backoff."
    )
    dead: bool = Field(
        default=False,
        description="True: dead now, whatever attempts remain. False: pending again while attempts remain "
        "(run_at now + retry_after, or the backoff), else dead.",
    )


class NackResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"id": 1043, "status": "pending", "run_at": "2025-06-30T09:18:12.530221Z"}]
        }
    )

    id: int = Field(description="The job nacked.")
    status: JobStatus = Field(description="pending (to be retried at run_at) or dead.")
    run_at: datetime = Field(description="When it runs again; a dead job's run_at, unchanged.")


class ExtendRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": 1043, "lease_token": _TOKEN, "visibility_timeout": 300},
                {
                    "id": 1043,
                    "lease_token": _TOKEN,
                    "visibility_timeout": 300,
                    "progress": {"sent": 40, "of": 100},
                },
            ]
        }
    )

    id: JobId = Field(description="The leased job's id.")
    lease_token: LeaseToken
    visibility_timeout: LeaseSeconds = Field(
        description="Seconds from now to the lease's new deadline, at most 43,200 (12 h). To report "
        "progress alone, give the lease's visibility_timeout again."
    )
    progress: Any = Field(
        default=None,
        description="How far the job got: any JSON value, shown on the job until the next one;"
        " at most max_result_bytes encoded (larger is 413, nothing changes). Null: keep the last one.",
    )


class ExtendResponse(BaseModel):
    id: int = Field(description="The job extended.")
    lease_expires_at: datetime = Field(description="The lease's new deadline.")


class AckBatchRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {
                            "id": 1043,
                            "lease_token": _TOKEN,
                            "result": {"message_id": "<1043@mail.example.com>"},
                        },
                        {"id": 1044, "lease_token": _TOKEN_2},
                    ]
                }
            ]
        }
    )

    items: list[AckRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1-1000 acks, each as POST /ack takes it, each answered on its own.",
    )


class ReleaseRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"items": [{"id": 1043, "lease_token": _TOKEN}, {"id": 1044, "lease_token": _TOKEN_2}]}
            ]
        }
    )

    items: list[JobLeaseItem] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1-1000 leased jobs to give back, each with its lease token, each answered on its own.",
    )


class NackBatchRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {"id": 1043, "lease_token": _TOKEN, "error": "SMTP 451 4.7.1: try again later"},
                        {
                            "id": 1044,
                            "lease_token": _TOKEN_2,
                            "error": "mailbox does not exist",
                            "dead": True,
                        },
                    ]
                }
            ]
        }
    )

    items: list[NackRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1-1000 nacks, each as POST /nack takes it, each answered on its own.",
    )


class ItemResult(BaseModel):
    id: int = Field(description="The item's job id.")
    ok: bool = Field(
        description="True when the item's own token did it (an ack: or had already done it); false: see code."
    )
    code: ProblemCode | None = Field(
        default=None,
        description="Why not, when not ok: lease_lost or not_found; for an ack's result, payload_too_large"
        " or validation_error (nothing changed). Open to additions, as a problem's code.",
    )


class BatchResults(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"results": [{"id": 1043, "ok": True}, {"id": 1044, "ok": False, "code": "lease_lost"}]}
            ]
        }
    )

    results: list[ItemResult] = Field(description="One per item, in request order.")


class NackItemResult(ItemResult):
    status: JobStatus | None = Field(default=None, description="pending or dead, when ok.")
    run_at: datetime | None = Field(
        default=None, description="When ok: when it runs again; a dead job's run_at, unchanged."
    )


class NackBatchResults(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "results": [
                        {
                            "id": 1043,
                            "ok": True,
                            "status": "pending",
                            "run_at": "2025-06-30T09:18:12.530221Z",
                        },
                        {"id": 1044, "ok": True, "status": "dead", "run_at": "2025-06-30T09:15:07.002381Z"},
                        {"id": 1045, "ok": False, "code": "lease_lost"},
                    ]
                }
            ]
        }
    )

    results: list[NackItemResult] = Field(description="One per item, in request order.")


# --- operators -------------------------------------------------------------------------------------


class DeadPage(BaseModel):
    jobs: list[Job] = Field(description="Dead jobs, newest first, each with its last_error and attempts.")
    next_before_id: int | None = Field(description="Pass as before_id for the next page; null at the end.")


class JobPage(BaseModel):
    jobs: list[Job] = Field(description="Jobs of any status that match, newest first.")
    next_before_id: int | None = Field(
        description="Pass as before_id for the next page; null once nothing older is left. A page reads at "
        "most 10,000 jobs of its queue and status, and a search at most 2 MiB of their text, so with a "
        "rare kind, key or search it may come back short, even empty, and still have a next page."
    )
    stopped_by: Literal["jobs", "bytes"] | None = Field(
        description="Why a short page stopped before the jobs ran out: `jobs` (it read the 10,000 jobs a "
        "page reads) or `bytes` (its search read the 2 MiB of text a page searches). A token limited to some "
        "queues shares both among them. Null for a full page, or once nothing older is left."
    )


class RetryDeadRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            # ids, queue or both, not null: said with `not` rather than anyOf, which generators turn into
            # a union of two classes of their own (openapi-python-client) instead of one with both.
            "not": {"properties": {"ids": {"type": "null"}, "queue": {"type": "null"}}},
            "examples": [
                {"ids": [1043, 1051]},
                {"queue": "emails"},
                {"ids": [1043, 1051], "queue": "emails"},
            ],
        }
    )

    ids: list[JobId] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="The dead jobs to retry, 1-1000 ids (ids of jobs that are not dead are left alone). "
        "With queue: those of them in that queue.",
    )
    queue: QueueName | None = Field(
        default=None,
        description="Retry every dead job of this queue (a queue that does not exist is 404). With ids: "
        "only those ids.",
    )

    @model_validator(mode="after")
    def _something(self) -> RetryDeadRequest:
        if self.ids is None and self.queue is None:
            raise ValueError("give ids or queue")
        return self


class RetryDeadResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"retried": 2, "skipped": []}]})

    retried: int = Field(description="Dead jobs back to pending: attempts 0, run_at now.")
    skipped: list[int] = Field(description="Dead jobs left dead: an active job holds their dedup_key.")


class PurgeResponse(BaseModel):
    id: int = Field(description="The job purged.")
    purged: bool = Field(description="Always true: a job that is not dead is 409, an unknown one 404.")


MAX_KEY_CONCURRENCY = 100_000
MAX_RATE_PERIOD = 86400.0  # a rate's window, at most a day
KeyConcurrency = Annotated[
    int,
    Field(strict=False, ge=1, le=MAX_KEY_CONCURRENCY, description="Jobs of one key running at once."),
    Number,
]


class Rate(Body):
    """At most `limit` leases in any window of `period` seconds."""

    limit: Annotated[int, Field(strict=False, ge=1, le=1_000_000), Number] = Field(
        description="Leases at most, in any window of `period` seconds: 1-1,000,000."
    )
    period: Annotated[float, Field(gt=0, le=MAX_RATE_PERIOD, allow_inf_nan=False), Number] = Field(
        description="Seconds, at most a day."
    )


class QueueSettings(BaseModel):
    visibility_timeout: float = Field(
        description="Seconds a lease lasts when /lease gives none (default 30)."
    )
    max_attempts: int = Field(
        description="Leases a job gets before it goes dead, for jobs enqueued without their own; read when "
        "it matters, so jobs already waiting follow a change (default 5)."
    )
    backoff_base: float = Field(
        description="Seconds: a retry without retry_after waits backoff_base * 2^(attempts-1), plus 0-30 % "
        "jitter (default 30)."
    )
    backoff_cap: float = Field(description="Seconds: no backoff waits longer (default 3600).")
    retention: float = Field(
        description="Seconds completed and cancelled jobs are kept after they finish, then pruned (default "
        "86400). Dead jobs stay until retried or purged."
    )
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
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"visibility_timeout": 120, "max_attempts": 10, "backoff_base": 5, "backoff_cap": 600},
                {"retention": 604800},
                {
                    "key_concurrency": 2,
                    "fair": True,
                    "rate": {"limit": 100, "period": 60},
                    "key_rate": {"limit": 10, "period": 60},
                },
            ]
        }
    )

    visibility_timeout: LeaseSeconds | None = Field(
        default=None,
        description="Seconds a lease lasts when /lease gives none: above 0, at most 43,200 (12 h). Null or "
        "absent keeps it.",
    )
    max_attempts: MaxAttempts | None = Field(
        default=None,
        description="Leases a job without its own max_attempts gets before it goes dead (1-1000); jobs "
        "already waiting follow it too. Null or absent keeps it.",
    )
    backoff_base: Seconds | None = Field(
        default=None,
        description="Seconds: a retry without retry_after waits backoff_base * 2^(attempts-1), plus 0-30 % "
        "jitter. Null or absent keeps it.",
    )
    backoff_cap: Seconds | None = Field(
        default=None, description="Seconds: no backoff waits longer. Null or absent keeps it."
    )
    retention: Seconds | None = Field(
        default=None,
        description="Seconds completed and cancelled jobs are kept after they finish; jobs finished before "
        "the change keep the retention they had. Null or absent keeps it.",
    )
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

    concurrency: KeyConcurrency | None = Field(
        default=None,
        description="At most this many of the key's jobs running at once (1-100,000), in place of the "
        "queue's key_concurrency. Null or absent: the queue's.",
    )
    rate: Rate | None = Field(
        default=None,
        description="The key's own rate, in place of the queue's key_rate. Null or absent: the queue's.",
    )


class KeyView(BaseModel):
    queue: str = Field(description="The key's queue.")
    key: str = Field(description="The key.")
    concurrency: int | None = Field(description="The key's own concurrency; null: the queue's.")
    rate: Rate | None = Field(description="The key's own rate; null: the queue's key_rate.")
    pending: int = Field(description="Jobs of the key waiting (ready or scheduled).")
    running: int = Field(description="Jobs of the key running now.")


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
    queue: str = Field(description="The key's queue.")
    key: str = Field(description="The key, which follows the queue's settings again.")
    deleted: bool = Field(description="Always true: a key without overrides is 404.")


_QUEUE_ROW_EXAMPLE = {
    "queue": "emails",
    "pending": 12,
    "scheduled": 3,
    "running": 4,
    "dead": 1,
    "completed": 5820,
    "oldest_pending_age_seconds": 0.84,
    "paused": False,
}


class QueueRow(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_QUEUE_ROW_EXAMPLE]})

    queue: str = Field(description="The queue's name.")
    pending: int = Field(description="Ready now (run_at <= now).")
    scheduled: int = Field(description="Waiting for a future run_at.")
    running: int = Field(description="Leased to workers now.")
    dead: int = Field(description="Kept until retried or purged.")
    completed: int = Field(description="Not yet pruned.")
    oldest_pending_age_seconds: float = Field(description="Age of the oldest ready job (lag); 0 if none.")
    paused: bool = Field(description="Paused: leases take nothing from it; enqueues still land.")


class QueueDetail(QueueRow):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                _QUEUE_ROW_EXAMPLE
                | {
                    "settings": {
                        "visibility_timeout": 30.0,
                        "max_attempts": 5,
                        "backoff_base": 30.0,
                        "backoff_cap": 3600.0,
                        "retention": 86400.0,
                        "key_concurrency": 2,
                        "fair": True,
                        "rate": {"limit": 100, "period": 60.0},
                        "key_rate": {"limit": 10, "period": 60.0},
                    }
                }
            ]
        }
    )

    settings: QueueSettings = Field(description="The queue's settings, defaults included.")


class Health(BaseModel):
    status: str = Field(description='"ok": the process is up (the database is not asked).')


class HorizonHolder(BaseModel):
    holder: str = Field(description="session, replication_slot or prepared_transaction.")
    pid: int | None = Field(description="The session's process id (a slot's: of its walsender, if active).")
    name: str | None = Field(description="The session's application_name, the slot's name, or the gid.")
    state: str | None = Field(description="The session's state (e.g. idle in transaction), or the slot's.")
    seconds: float | None = Field(description="How long its transaction has been open (null: no such time).")
    xid_age: int = Field(description="How many transactions old its xmin is.")
    query: str | None = Field(description="The session's last statement, cut at 200 characters.")


class JobsTableHealth(BaseModel):
    live_tuples: int = Field(description="Live rows (statistics estimate).")
    dead_tuples: int = Field(description="Rows dead and not yet vacuumed (statistics estimate).")
    bytes: int = Field(description="The jobs table's heap.")
    claim_index_bytes: int = Field(description="Size of the index leases claim jobs by, in bytes.")
    since_vacuum_seconds: float | None = Field(description="Since its last vacuum; null: none recorded.")


class DatabaseHealth(BaseModel):
    as_of: datetime | None = Field(description="When this replica last read it (every metrics interval).")
    oldest_snapshot: HorizonHolder | None = Field(
        description="What holds back vacuum of jobq's tables furthest: the oldest xmin in the database."
    )
    holding_back: bool = Field(description="Open a minute or more (a slot: 1,000,000 transactions).")
    jobs_table: JobsTableHealth | None = Field(
        description="The jobs table's rows, size and last vacuum; null before this replica first read them."
    )


class Readiness(BaseModel):
    ready: bool = Field(
        description="True: the database answers and this build runs on its schema. Otherwise the answer is "
        "503 unavailable, with ready false and these same fields beside the problem's."
    )
    database: bool = Field(description="The database answered.")
    schema_revision: str | None = Field(
        description="The schema's migration revision; null while the database is unreachable or before the "
        "first migration."
    )
    expected_revision: str = Field(
        description="This build's head revision: the schema may be at it or at a newer, compatible one."
    )
    compatible: bool | None = Field(
        default=None,
        description="Whether this build can run on the schema (null while the database is unreachable).",
    )
    compatible_from: str | None = Field(
        default=None,
        description="The oldest code revision the schema runs, as its migration recorded it; null: unknown.",
    )
    database_health: DatabaseHealth | None = Field(
        default=None,
        description="What holds back vacuum, and the jobs table's state, as of this replica's last metrics "
        "read. Details only: readiness does not depend on them.",
    )


# --- schedules -------------------------------------------------------------------------------------


_SCHEDULE_EXAMPLE = {
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "queue": "reports",
    "kind": "build_report",
    "payload": {"period": "day"},
    "catch_up": "once",
}


class ScheduleRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                _SCHEDULE_EXAMPLE,
                {
                    "cron": "*/30 * * * * *",
                    "queue": "sync",
                    "kind": "pull_orders",
                    "payload": {"partner": "partner-7"},
                    "key": "partner-7",
                    "priority": 5,
                    "max_attempts": 1,
                    "catch_up": "skip",
                    "paused": True,
                },
            ]
        }
    )

    cron: str = Field(
        min_length=1,
        max_length=256,
        description="Five fields (minute hour day month weekday), or six with a leading seconds field.",
        examples=["0 3 * * *"],
    )
    timezone: str = Field(
        default="UTC", min_length=1, max_length=64, description="IANA time zone the cron is read in."
    )
    queue: QueueName = Field(description="The queue each job goes into.")
    payload: Any = Field(description="The payload of each job it enqueues; any JSON value, null included.")
    kind: Kind | None = Field(
        default=None,
        description="The kind of each job it enqueues: 1-128 of A-Z a-z 0-9 _ . : -. Null: none.",
    )
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
    paused: bool = Field(
        default=False, description="True: declared paused, no slot fires until it is resumed."
    )

    @model_validator(mode="after")
    def _cron_and_timezone(self) -> ScheduleRequest:
        Cron(self.cron, self.timezone)  # a CronError (a ValueError) says what is wrong
        return self


class Schedule(BaseModel):
    name: str = Field(description="The schedule's name, in the queue-name alphabet.")
    cron: str = Field(description="As declared: five fields, or six with a leading seconds field.")
    timezone: str = Field(description="The IANA time zone the cron is read in.")
    queue: str = Field(description="The queue each job goes into.")
    payload: Any = Field(description="The payload of each job it enqueues; any JSON value, null included.")
    kind: str | None = Field(description="The kind of each job it enqueues; null: none.")
    priority: int = Field(description="Each job's priority; lower runs first.")
    max_attempts: int | None = Field(description="Each job's max_attempts; null: the queue's setting.")
    key: str | None = Field(description="Each job's key, for keyed flow control; null: none.")
    catch_up: CatchUp = Field(description="What missed slots enqueue: skip (none), once (one job), all.")
    paused: bool = Field(description="True: no slot fires (next_run_at is null) until it is resumed.")
    next_run_at: datetime | None = Field(description="The next slot; null while paused.")
    last_run_at: datetime | None = Field(description="The last slot fired, or the last trigger.")
    last_job_id: int | None = Field(description="The job the last slot or trigger enqueued.")
    created_at: datetime = Field(description="When it was first declared.")
    updated_at: datetime = Field(description="Its latest PUT, pause or resume.")


class TriggeredSchedule(Schedule):
    job_id: int = Field(description="The job the trigger enqueued.")


class ScheduleList(BaseModel):
    schedules: list[Schedule] = Field(description="By name, a page of `limit` at most.")
    next_after: str | None = Field(description="Pass as `after` for the next page; null at the end.")


class DeletedSchedule(BaseModel):
    name: str = Field(description="The schedule removed; the jobs it enqueued stay.")
    deleted: bool = Field(description="Always true: an unknown schedule is 404.")
