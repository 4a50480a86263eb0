"""The bodies of the operators' API: dead jobs and job pages, retries and purges, queues and their
settings, and the workers seen.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.http.schemas.common import (
    Body,
    JobId,
    KeyConcurrency,
    LeaseSeconds,
    MaxAttempts,
    Number,
    QueueName,
    Rate,
    Seconds,
)
from app.http.schemas.producers import Job


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


class PushSettings(Body):
    """Where and how the service delivers the queue's jobs itself (push delivery)."""

    url: Annotated[str, Field(min_length=1, max_length=2048)] = Field(
        description="The endpoint each job is POSTed to: an http(s) URL starting with one of the service's "
        "JOBQ_PUSH_ALLOWED_URLS."
    )
    timeout: Annotated[float, Field(ge=1, le=900, allow_inf_nan=False), Number] = Field(
        default=30.0,
        description="Seconds a delivery may take, its answer read (1-900, default 30); past it the "
        "attempt fails.",
    )
    concurrency: Annotated[int, Field(strict=False, ge=1, le=1000), Number] = Field(
        default=10, description="Deliveries in flight at once across every replica (1-1000, default 10)."
    )


class PushView(BaseModel):
    url: str = Field(description="The endpoint each job is POSTed to.")
    timeout: float = Field(description="Seconds a delivery may take.")
    concurrency: int = Field(description="Deliveries in flight at once, across every replica.")


class PushSecret(BaseModel):
    secret: str = Field(
        description="The queue's new signing secret (`whsec_` and base64), shown this once; the one it "
        "replaced stays valid for 24 hours."
    )


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
    push: PushSettings | None = Field(
        default=None,
        description="Deliver the queue's jobs to this endpoint (push delivery); null stops it, absent "
        "keeps it. The first target a queue gets makes its signing secret, answered once as "
        "`push_secret`.",
    )

    @property
    def push_set(self) -> bool:
        return "push" in self.model_fields_set

    @property
    def flow(self) -> dict[str, object]:
        """The flow-control settings this patch changes, as CONFIGURE_FLOW takes them."""
        return {name: _plain(getattr(self, name)) for name in FLOW_SETTINGS if name in self.model_fields_set}


def _plain(value: object) -> object:
    return value.model_dump() if isinstance(value, BaseModel) else value


_QUEUE_ROW_EXAMPLE = {
    "queue": "emails",
    "pending": 12,
    "scheduled": 3,
    "running": 4,
    "dead": 1,
    "completed": 5820,
    "waiting": 0,
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
    waiting: int = Field(default=0, description="Waiting for their parents to end (depends_on).")
    oldest_pending_age_seconds: float = Field(description="Age of the oldest ready job (lag); 0 if none.")
    paused: bool = Field(description="Paused: leases take nothing from it; enqueues still land.")
    push: PushView | None = Field(
        default=None,
        description="Where the service delivers its jobs (never the secret); null: workers lease them.",
    )


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


class QueueConfigured(QueueDetail):
    push_secret: str | None = Field(
        default=None,
        description="Only in the answer of the PATCH that gave the queue its first push target: the secret "
        "its requests are signed with, shown this once (POST /queues/{queue}/push/secret makes another).",
    )


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
