"""The bodies of a worker's calls (POST /lease, /ack, /nack, /extend, /release and their batches): a
lease, the token it is held under, and each item's own answer in a batch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.states import JobStatus
from app.http.problems import ProblemCode
from app.http.schemas.common import (
    EXAMPLE_TRACEPARENT,
    MAX_BATCH,
    Body,
    JobId,
    LeaseSeconds,
    LeaseToken,
    Number,
    QueueName,
    Seconds,
)
from app.http.schemas.durable import EventReached, ParkSeconds
from app.http.schemas.producers import ParentJob

# Examples for the document: lease tokens as /lease hands them out.
_TOKEN = "3f2b8c1e-5a4d-4e7b-9c0a-1d2e3f4a5b6c.emails"
_TOKEN_2 = "9a0c7d4e-21b3-4f6a-8e5d-7c1b2a3f4e5d.emails"


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
    per_key: Annotated[int, Field(strict=False, ge=1, le=1000), Number] = Field(
        default=1,
        description="Of a key whose jobs run in order (key_concurrency 1) and has none running, up to this "
        "many jobs in this lease: its next one and those right after it, in order; the key stays held until "
        "every one of them has ended. As an SQS FIFO receive takes several messages of one group. A worker "
        "that takes several owns their order: if the first fails, ack or release the others as it sees fit. "
        "Taken from the front of the queue; not in fair or rated queues. 1-1000, at most max_jobs.",
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
    "traceparent": EXAMPLE_TRACEPARENT,
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
    parents: list[ParentJob] | None = Field(
        default=None,
        description="Only for a job with parents (depends_on), at most 100 of them: each one's id, kind, "
        "status and result, so that the child reads what its parents returned without another request "
        "(GET /jobs/{id}/parents pages them for a job with more).",
    )
    steps: dict[str, Any] | None = Field(
        default=None,
        description="Only for a job with recorded steps (POST /jobs/{id}/steps): what each returned, by "
        "name, so that a handler run again from the top skips what it did already.",
    )
    events: list[EventReached] | None = Field(
        default=None,
        description="Only for a job that events reached (or whose waits ran out): each, in order.",
    )


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


class ReleaseItem(JobLeaseItem):
    """A leased job to give back, and when it may run again."""

    delay: ParkSeconds | None = Field(
        default=None,
        description="Seconds until it is due again, 0-31,536,000 (a year): a durable sleep, the attempt not "
        "counted and no worker held meanwhile. Null or 0: due again at once, at its place in line.",
    )


class ReleaseRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"items": [{"id": 1043, "lease_token": _TOKEN}, {"id": 1044, "lease_token": _TOKEN_2}]},
                {"items": [{"id": 1043, "lease_token": _TOKEN, "delay": 3600}]},
            ]
        }
    )

    items: list[ReleaseItem] = Field(
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
