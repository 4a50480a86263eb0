"""The bodies of workflows (POST /workflows, GET /workflows, GET /workflows/{id}): jobs made together, each
named by a ref its siblings give as parents."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.limits import MAX_PARENTS, NO_NUL
from app.core.states import JobStatus, RunIf, WorkflowStatus
from app.http.schemas.common import (
    MAX_BATCH,
    Body,
    JobId,
    JobKey,
    Kind,
    MaxAttempts,
    Priority,
    QueueName,
    RunAt,
    Seconds,
)

MAX_REF = 128
Ref = Annotated[str, Field(min_length=1, max_length=MAX_REF, pattern=NO_NUL)]

_EXAMPLE_REQUEST = {
    "name": "order-7",
    "jobs": [
        {"ref": "charge", "queue": "payments", "kind": "charge", "payload": {"order": 7}},
        {"ref": "render", "queue": "pdf", "kind": "render_invoice", "payload": {"order": 7}},
        {
            "ref": "send",
            "queue": "emails",
            "kind": "send_invoice",
            "payload": {"order": 7},
            "depends_on": ["charge", "render"],
        },
    ],
}


class WorkflowJobRequest(Body):
    ref: Ref = Field(description="1-128 characters, unique in the request: what its siblings name it by.")
    queue: QueueName = Field(description="The queue to put the job in (created with its first job).")
    payload: Any = Field(description="Any JSON value, null included; at most max_payload_bytes encoded.")
    kind: Kind | None = Field(default=None, description="What the job is; null: none.")
    key: JobKey | None = Field(default=None, description="What flow control groups it by; null: none.")
    priority: Priority = 0
    max_attempts: MaxAttempts | None = Field(default=None, description="Default: the queue's setting.")
    delay: Seconds | None = Field(
        default=None, description="Not before this many seconds after it is ready (its parents decided it)."
    )
    run_at: RunAt | None = Field(default=None, strict=False, description="Not before this time (RFC 3339).")
    depends_on: list[Ref | JobId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PARENTS,
        description="Its parents: refs of jobs of this request (strings) or ids of existing jobs (numbers).",
    )
    run_if: RunIf | None = Field(
        default=None,
        strict=False,
        description="With depends_on: completed (default), finished or failed, as on POST /jobs.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkflowJobRequest:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_if is not None and self.depends_on is None:
            raise ValueError("run_if goes with depends_on: it says what the parents must end as")
        return self


class WorkflowRequest(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE_REQUEST]})

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_NUL)] | None = Field(
        default=None, description="What the workflow is, for people and for GET /workflows?name=; null: none."
    )
    jobs: list[WorkflowJobRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1-1000 jobs, made all or none: a ref used twice, a parent ref that is no job's, or a"
        " cycle is a 422 that names them.",
    )


class WorkflowJobMade(BaseModel):
    ref: str = Field(description="The job's ref, as sent.")
    id: int = Field(description="The job's id.")
    status: JobStatus = Field(
        description="pending for a job without parents; waiting for one with (or pending, or cancelled, for"
        " one whose parents outside the workflow had all ended)."
    )


class WorkflowMade(BaseModel):
    id: int = Field(description="The workflow's id.")
    name: str | None = Field(description="As sent; null when none was given.")
    status: WorkflowStatus = Field(description="running, unless every job ended at once.")
    created_at: datetime = Field(description="When it was made.")
    jobs: list[WorkflowJobMade] = Field(description="Each job's ref and id, in the request's order.")


class WorkflowJob(BaseModel):
    ref: str = Field(description="The job's ref.")
    id: int = Field(description="The job's id (GET /jobs/{id} shows it whole).")
    queue: str = Field(description="Its queue.")
    kind: str | None = Field(description="Its kind; null when none was given.")
    status: JobStatus = Field(description="Its status now.")
    depends_on: list[str | int] = Field(
        description="Its parents: the refs of its siblings, and the ids of parents outside the workflow."
    )


class Workflow(BaseModel):
    id: int = Field(description="The workflow's id.")
    name: str | None = Field(description="As made; null when none was given.")
    status: WorkflowStatus = Field(
        description="running while any job may still run (waiting, pending or running); then completed"
        " (every job completed), failed (one at least dead or cancelled) or cancelled (DELETE)."
    )
    created_at: datetime = Field(description="When it was made.")
    finished_at: datetime | None = Field(description="When its last job ended; null while running.")
    counts: dict[str, int] = Field(description="How many of its jobs are in each status.")
    jobs: list[WorkflowJob] = Field(description="Its jobs in the request's order (pruned ones left out).")


class WorkflowRow(BaseModel):
    id: int = Field(description="The workflow's id.")
    name: str | None = Field(description="As made; null when none was given.")
    status: WorkflowStatus = Field(description="Its status as last seen (see `workflows`).")
    created_at: datetime = Field(description="When it was made.")
    finished_at: datetime | None = Field(description="When its last job ended; null while running.")


class WorkflowPage(BaseModel):
    workflows: list[WorkflowRow] = Field(
        description="Newest first. The status is the one last seen: a workflow nobody reads is brought up"
        " to date by the background loop within JOBQ_METRICS_INTERVAL."
    )
    next_before_id: int | None = Field(description="Pass as before_id for the next page; null at the end.")
