"""Operators: dead letters and queues. Viewers read them; admins change them.

A token limited to some queues (app/core/access.py) is refused (403) a queue it names outside them; the lists
show its queues only, and a dead job of another queue is, by id, a job that does not exist."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app import service
from app.core.limits import (
    KIND_PATTERN,
    MAX_JOB_ID,
    MAX_KEY,
    MAX_KIND,
    MAX_QUEUE_NAME,
    MAX_SEARCH,
    NO_NUL,
    QUEUE_NAME_PATTERN,
)
from app.core.states import JobStatus
from app.http.auth import Admin, Caller, QueueReader, Viewer
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.schemas import (
    DeadPage,
    Job,
    JobPage,
    PurgeResponse,
    PushSecret,
    QueueConfigured,
    QueueDetail,
    QueueRow,
    QueueSettingsPatch,
    RetryDeadRequest,
    RetryDeadResponse,
    WorkerList,
)
from app.http.web import JSONBody

router = APIRouter(
    tags=["operators"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]


@router.get("/jobs", dependencies=[Viewer], response_model=None, responses=answers(JobPage, 404))
async def list_jobs(
    db: DB,
    caller: Caller,
    queue: Annotated[str | None, Query(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)] = None,
    status: JobStatus | None = None,
    kind: Annotated[str | None, Query(pattern=KIND_PATTERN, max_length=MAX_KIND)] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY, pattern=NO_NUL)] = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_SEARCH,
            pattern=NO_NUL,
            description="Text to find, in any case, in the dedup_key, the last error or the payload's JSON "
            'text as PostgreSQL writes it (`{"to": "ada"}`: a space after each colon and comma).',
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
) -> JSONBody:
    """Jobs of any status, newest first, filtered; pass `next_before_id` back as `before_id` for the next
    page. A `queue` that does not exist is 404."""
    if queue is not None:
        caller.admit(queue)
    page = await service.list_jobs(
        db,
        queue=queue,
        status=status,
        kind=kind,
        key=key,
        search=q,
        limit=limit,
        before_id=before_id,
        scope=caller.like,
    )
    return JSONBody(page)


@router.get("/dead", dependencies=[Viewer], response_model=None, responses=answers(DeadPage, 404))
async def list_dead(
    db: DB,
    caller: Caller,
    queue: Annotated[str | None, Query(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
) -> JSONBody:
    """Dead jobs, newest first; pass `next_before_id` back as `before_id` for the next page. A `queue`
    that does not exist is 404."""
    if queue is not None:
        caller.admit(queue)
    return JSONBody(await service.dead_jobs(db, queue, limit, before_id, caller.like))


@router.post(
    "/dead/retry", dependencies=[Admin], response_model=None, responses=answers(RetryDeadResponse, 404)
)
async def retry_dead(body: RetryDeadRequest, db: DB, caller: Caller) -> JSONBody:
    """Dead jobs (by ids, by queue, or both) back to pending with attempts reset and run_at now. A
    `queue` that does not exist is 404; ids that are not dead jobs are not counted in `retried`."""
    if body.queue is not None:
        caller.admit(body.queue)
    return JSONBody(await service.retry_dead(db, body.ids, body.queue, caller.like))


@router.delete(
    "/dead/{id}", dependencies=[Admin], response_model=None, responses=answers(PurgeResponse, 404, 409)
)
async def purge_dead(id: Annotated[int, Path(ge=1, le=MAX_JOB_ID)], db: DB, caller: Caller) -> JSONBody:
    """Delete a dead job for good; a job that is not dead is 409 conflict."""
    return JSONBody(await service.purge_dead(db, id, caller.like))


@router.post("/jobs/{id}/run", dependencies=[Admin], response_model=None, responses=answers(Job, 404, 409))
async def run_job_now(id: Annotated[int, Path(ge=1, le=MAX_JOB_ID)], db: DB, caller: Caller) -> JSONBody:
    """Run a pending job that waits for its `run_at` (scheduled, or backing off before a retry) now: it is
    ready at once, and the queue's long-polls are woken. A job already due, or in any other state, is
    409 conflict."""
    return JSONBody(await service.run_now(db, id, caller.like))


@router.get("/workers", dependencies=[Viewer], response_model=None, responses=answers(WorkerList))
async def list_workers(db: DB, caller: Caller) -> JSONBody:
    """Workers that leased in the last hour (by the `worker_id` they send) and any holding a running job:
    their queues, when last seen, jobs leased and jobs held now. Replicas write what they saw every few
    seconds, so a worker shows up within that time."""
    return JSONBody({"workers": await service.list_workers(db, caller.like)})


@router.get("/queues", dependencies=[Viewer], response_model=None, responses=answers(list[QueueRow]))
async def list_queues(db: DB, caller: Caller) -> JSONBody:
    """Every queue the token may see, with its counts by status, the age of its oldest ready job and
    whether it is paused."""
    return JSONBody(await service.queues(db, caller.like))


@router.get(
    "/queues/{queue}", dependencies=[QueueReader], response_model=None, responses=answers(QueueDetail, 404)
)
async def get_queue(queue: QueuePath, db: DB, caller: Caller) -> JSONBody:
    """One queue's counts and its settings (the defaults for a queue nobody configured)."""
    caller.admit(queue)
    return JSONBody(await service.queue(db, queue))


@router.patch(
    "/queues/{queue}", dependencies=[Admin], response_model=None, responses=answers(QueueConfigured)
)
async def configure_queue(
    queue: QueuePath, body: QueueSettingsPatch, runtime: RuntimeDep, caller: Caller
) -> JSONBody:
    """Change some settings (creating the queue if need be); the rest keep their values. With `push`,
    the service delivers the queue's jobs to that endpoint itself (422 when the URL is not among
    JOBQ_PUSH_ALLOWED_URLS)."""
    caller.admit(queue)
    return JSONBody(await service.configure_queue(runtime, queue, body))


@router.post(
    "/queues/{queue}/push/secret", dependencies=[Admin], response_model=None, responses=answers(PushSecret)
)
async def rotate_push_secret(queue: QueuePath, db: DB, caller: Caller) -> JSONBody:
    """Make a new signing secret for the queue's push deliveries, answered this once; the old one stays
    valid for 24 hours (deliveries carry a signature by each). Creates the queue if need be."""
    caller.admit(queue)
    return JSONBody({"secret": await service.rotate_push_secret(db, queue)})


@router.post("/queues/{queue}/pause", dependencies=[Admin], response_model=None, responses=answers(QueueRow))
async def pause_queue(queue: QueuePath, db: DB, caller: Caller) -> JSONBody:
    """Stop leasing from the queue (enqueues still land). Creates the queue if need be."""
    caller.admit(queue)
    return JSONBody(await service.set_paused(db, queue, True))


@router.post("/queues/{queue}/resume", dependencies=[Admin], response_model=None, responses=answers(QueueRow))
async def resume_queue(queue: QueuePath, db: DB, caller: Caller) -> JSONBody:
    """Lease from the queue again; waiting long-polls are woken. Creates the queue if need be."""
    caller.admit(queue)
    return JSONBody(await service.set_paused(db, queue, False))
