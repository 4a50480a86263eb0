"""The bodies of enqueueing and reading jobs (POST /jobs, /jobs/batch, GET /jobs/{id}): the job as it is
sent, and the job as every answer shows it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.limits import MAX_KEY, MAX_PARENTS, NO_NUL
from app.core.states import JobStatus, RunIf
from app.http.schemas.common import (
    EXAMPLE_TRACEPARENT,
    MAX_BATCH,
    Body,
    DedupKey,
    JobId,
    JobKey,
    Kind,
    MaxAttempts,
    Priority,
    QueueName,
    RunAt,
    Seconds,
)
from app.http.schemas.durable import EventReached, WaitingFor
from app.http.schemas.trace import TraceParent, TraceState

# Examples for the document: bodies as a client sends them, answers as the service writes them.
_PAYLOAD = {"to": "ada@example.com", "template": "welcome"}
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


class Debounce(Body):
    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY, pattern=NO_NUL)] = Field(
        description="1-256 characters: enqueues of the queue with the same key make one job while it waits."
    )
    seconds: Seconds = Field(description="The job runs this long after the last enqueue of the burst.")
    max_seconds: Seconds | None = Field(
        default=None,
        description="Never later than this long after the burst's first enqueue (its job's creation), so a"
        " key enqueued without a pause still runs; null: no such bound.",
    )


class EnqueueRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["run_at", "delay"]},
            # A tracestate (not null) needs a traceparent (not null).
            "if": {"required": ["tracestate"], "properties": {"tracestate": {"type": "string"}}},
            "then": {"required": ["traceparent"], "properties": {"traceparent": {"type": "string"}}},
            "allOf": [
                # A run_if (not null) needs parents (not null); parents take no dedup_key.
                {
                    "if": {"required": ["run_if"], "properties": {"run_if": {"type": "string"}}},
                    "then": {"required": ["depends_on"], "properties": {"depends_on": {"type": "array"}}},
                },
                # A debounce (not null) sets run_at and the job itself: none of these (not null) with it.
                {
                    "if": {"required": ["debounce"], "properties": {"debounce": {"type": "object"}}},
                    "then": {
                        "properties": {
                            name: {"type": "null"} for name in ("run_at", "delay", "dedup_key", "depends_on")
                        }
                    },
                },
                {
                    "if": {
                        "required": ["depends_on", "dedup_key"],
                        "properties": {"depends_on": {"type": "array"}, "dedup_key": {"type": "string"}},
                    },
                    "then": False,
                },
            ],
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
    depends_on: list[JobId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PARENTS,
        description="1-1000 ids of existing jobs (its parents): the job starts `waiting` and is decided once,"
        " when the last of them ends (completed, dead or cancelled), by `run_if`: pending then (a `delay`"
        " counts from then), else cancelled. Parents that have ended already count at once. Not with"
        " `dedup_key`. Null: none.",
    )
    run_if: RunIf | None = Field(
        default=None,
        strict=False,  # the enum from its JSON string
        description="With `depends_on`: `completed` (default; every parent completed), `finished` (whatever"
        " they ended as) or `failed` (one at least dead or cancelled).",
    )

    debounce: Debounce | None = Field(
        default=None,
        description="While a job of the queue with this debounce key is pending, an enqueue with the key"
        " replaces its payload and moves its run_at to now + seconds (never past its creation + max_seconds),"
        " and answers 200 with it (`debounced` true); otherwise a new job is made to run in `seconds`. Not"
        " with run_at, delay, dedup_key or depends_on.",
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> EnqueueRequest:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.tracestate is not None and self.traceparent is None:
            raise ValueError("tracestate goes with a traceparent: give both, or neither")
        if self.run_if is not None and self.depends_on is None:
            raise ValueError("run_if goes with depends_on: it says what the parents must end as")
        if self.debounce is not None and any(
            value is not None for value in (self.run_at, self.delay, self.dedup_key, self.depends_on)
        ):
            raise ValueError(
                "debounce sets when the job runs and which job an enqueue lands in: give no run_at, delay,"
                " dedup_key or depends_on with it"
            )
        if self.depends_on is not None and self.dedup_key is not None:
            raise ValueError(
                "a job with depends_on takes no dedup_key: decided later, it could meet an active job"
                " holding the same key"
            )
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
    "traceparent": EXAMPLE_TRACEPARENT,
    "tracestate": None,
    "depends_on": None,
    "run_if": None,
    "workflow_id": None,
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


class Delivery(BaseModel):
    at: datetime = Field(description="When the delivery ended.")
    outcome: Literal["completed", "failed", "retry_later", "released"] = Field(
        description="completed (2xx), failed (another status, a redirect, a timeout, a connection or TLS "
        "error: the attempt counted), retry_later (429 or 503 with Retry-After: not counted), released "
        "(given back unanswered as a replica stopped: not counted)."
    )
    status: int | None = Field(description="The endpoint's HTTP status; null when it gave none.")
    ms: float = Field(description="Milliseconds from the request sent to the answer read.")
    error: str | None = Field(default=None, description="What failed, as last_error says it.")
    retry_after: float | None = Field(default=None, description="Seconds the endpoint asked to wait.")
    note: str | None = Field(
        default=None, description="Why a 2xx answer's body was not kept as the result (too large, not JSON)."
    )


class Job(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_JOB_EXAMPLE, _DEAD_JOB_EXAMPLE]})

    id: int = Field(description="The job's id: an integer below 2^53.")
    queue: str = Field(description="The queue it is in.")
    kind: str | None = Field(description="As enqueued; null when none was given.")
    key: str | None = Field(default=None, description="As enqueued; null when none was given.")
    status: JobStatus = Field(
        description="waiting (for its parents to end), pending (waiting to run, now or at its run_at), "
        "running (leased), completed, dead (out of attempts, or nacked as dead; kept until retried or "
        "purged) or cancelled."
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
    depends_on: list[int] | None = Field(default=None, description="Its parents, as enqueued; null: none.")
    run_if: RunIf | None = Field(
        default=None, description="With parents: what they must end as for it to run; null: no parents."
    )
    workflow_id: int | None = Field(default=None, description="The workflow that made it; null: none.")
    delivery: Delivery | None = Field(
        default=None, description="Its last push delivery (its queue has a push target); null: never pushed."
    )
    steps: dict[str, Any] | None = Field(
        default=None,
        description="The steps its handler recorded (POST /jobs/{id}/steps), by name; null: none.",
    )
    events: list[EventReached] | None = Field(
        default=None,
        description="The events that reached it, and its waits that ran out, in order; null: none.",
    )
    waiting_for: WaitingFor | None = Field(
        default=None, description="While it waits for an event: its name and the wait's deadline; else null."
    )
    sleeping_until: datetime | None = Field(
        default=None,
        description="While it sleeps (released with a delay, POST /release): until when; else null.",
    )


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
    debounced: bool = Field(
        default=False,
        description="True when `debounce` found a pending job of its key, whose payload and run_at it"
        " replaced; this is that job. Present only for an enqueue with `debounce`.",
    )


class EnqueueBatchResponse(BaseModel):
    jobs: list[EnqueuedJob] = Field(description="The jobs, in request order.")


class ParentJob(BaseModel):
    id: int = Field(description="The parent's id.")
    kind: str | None = Field(description="As enqueued; null when none was given.")
    status: JobStatus = Field(description="Where it is now: a leased child's parents have all ended.")
    result: Any = Field(description="What its ack kept (any JSON value); null when none.")


class ParentPage(BaseModel):
    parents: list[ParentJob] = Field(
        description="The job's parents in id order (one pruned by its queue's retention is left out)."
    )
    next_after_id: int | None = Field(
        description="Pass as after_id for the next page; null once none is left."
    )
