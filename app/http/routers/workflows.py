"""Workflows: jobs made together, each after its parents (app/service/workflows.py).

Making one is a producer's, with an Idempotency-Key as on POST /jobs; reading one is any role's that
reads jobs; cancelling and resuming one is an admin's. A token limited to some queues makes workflows
whose jobs are all in its queues, and sees or acts on only those (any other is 404, as if it did not
exist)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from app.core.limits import MAX_JOB_ID, NO_NUL
from app.core.states import WorkflowStatus
from app.http.auth import Admin, Caller, Producer, Reader
from app.http.deps import RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.routers.producers import IDEMPOTENCY_HEADER, idempotency_of
from app.http.schemas.workflows import Workflow, WorkflowMade, WorkflowPage, WorkflowRequest
from app.http.web import JSONBody, disconnected
from app.service import workflows
from app.service.arguments import WorkflowJob

router = APIRouter(
    tags=["workflows"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
WorkflowId = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]


@router.post(
    "/workflows",
    dependencies=[Producer],
    response_model=None,
    status_code=201,
    responses=answers(WorkflowMade, 409, 413, status=201),
    openapi_extra=IDEMPOTENCY_HEADER,
)
async def create_workflow(
    body: WorkflowRequest, runtime: RuntimeDep, caller: Caller, request: Request
) -> JSONBody:
    """Make the workflow's jobs, all or none, each job's parents given as refs of its siblings or ids of
    existing jobs: a job without parents is pending at once, the others wait for theirs."""
    if caller.queues is not None:
        for i, job in enumerate(body.jobs):
            caller.admit(job.queue, where=f"jobs[{i}].queue")
    jobs = [WorkflowJob(**job.model_dump()) for job in body.jobs]
    answer = await workflows.create_workflow(
        runtime, body.name, jobs, idempotency_of(request, "/workflows"), caller.like
    )
    return JSONBody(answer, status_code=201)


@router.get("/workflows", dependencies=[Reader], response_model=None, responses=answers(WorkflowPage))
async def list_workflows(
    runtime: RuntimeDep,
    caller: Caller,
    status: Annotated[WorkflowStatus | None, Query(description="Only workflows in this status.")] = None,
    name: Annotated[
        str | None,
        Query(min_length=1, max_length=128, pattern=NO_NUL, description="Only those of this name."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before_id: Annotated[int, Query(ge=1, le=MAX_JOB_ID + 1)] = MAX_JOB_ID + 1,
) -> JSONBody:
    """Workflows newest first; pass `next_before_id` back as `before_id` for the next page. A token limited
    to some queues sees the workflows whose jobs are all in them."""
    return JSONBody(await workflows.list_workflows(runtime.db, status, name, limit, before_id, caller.like))


@router.get("/workflows/{id}", dependencies=[Reader], response_model=None, responses=answers(Workflow, 404))
async def get_workflow(
    id: WorkflowId,
    runtime: RuntimeDep,
    caller: Caller,
    request: Request,
    wait: Annotated[
        float,
        Query(ge=0, le=60, description="Seconds to wait for it to finish before answering; 0: at once."),
    ] = 0,
) -> JSONBody:
    """The workflow, its status and its jobs; with `wait`, once it has finished or `wait` runs out."""
    if wait <= 0:
        return JSONBody(await workflows.visible_workflow(runtime, id, caller))
    await workflows.visible_workflow(runtime, id, caller)
    return JSONBody(await workflows.wait_for_workflow(runtime, id, wait, disconnected(request)))


@router.delete(
    "/workflows/{id}", dependencies=[Admin], response_model=None, responses=answers(Workflow, 404, 409)
)
async def cancel_workflow(id: WorkflowId, runtime: RuntimeDep, caller: Caller) -> JSONBody:
    """Cancel a running workflow: its waiting and pending jobs cancelled; running ones finish, and their
    children are cancelled. One that has finished is 409 (its status stays)."""
    workflow = await workflows.visible_workflow(runtime, id, caller)
    return JSONBody(await workflows.cancel_workflow(runtime, workflow))


@router.post(
    "/workflows/{id}/retry", dependencies=[Admin], response_model=None, responses=answers(Workflow, 404, 409)
)
async def retry_workflow(id: WorkflowId, runtime: RuntimeDep, caller: Caller) -> JSONBody:
    """Resume a failed workflow where it failed: its dead jobs pending again (attempts reset), the jobs
    cancelled because of them waiting again. Any other status is 409."""
    workflow = await workflows.visible_workflow(runtime, id, caller)
    return JSONBody(await workflows.retry_workflow(runtime, workflow))
