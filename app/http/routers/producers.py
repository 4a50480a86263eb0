"""Producers: enqueue, inspect and cancel jobs."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from app import service
from app.core.errors import Invalid
from app.core.limits import MAX_JOB_ID
from app.http.auth import Admin, Caller, Producer, Reader
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.schemas import (
    EnqueueBatchRequest,
    EnqueueBatchResponse,
    EnqueuedJob,
    EnqueueRequest,
    Job,
    ParentPage,
    trace_context,
)
from app.http.web import JSONBody, disconnected

router = APIRouter(
    tags=["producers"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]

# Enqueue at most once through retries: see app/service/idempotency.py `Once`. Read from the request rather
# than declared as a parameter, so the routes stay hot (app/http/fastpath/hot.py); documented in the OpenAPI
# here.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
IDEMPOTENCY_HEADER = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
            "description": "Send the request again with the same key (after a lost answer, say) and it is "
            "carried out once: the repeat gets the first answer again and inserts nothing, for "
            "JOBQ_IDEMPOTENCY_TTL seconds (300). Another request under a key in use is 409 conflict. "
            "Keys are per token. A fresh random value per call, e.g. a UUID.",
        },
        {
            "name": "traceparent",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "W3C Trace Context, as OpenTelemetry's HTTP instrumentation sends it: the trace "
            "context of each job that gives none of its own. Ignored when it is not a valid traceparent.",
        },
        {
            "name": "tracestate",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "W3C Trace Context: kept with `traceparent` from the header.",
        },
    ]
}


def idempotency_of(request: Request, route: str) -> service.Once | None:
    """The request's idempotency key, scoped to the bearer token that sent it; None without one."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise Invalid("the Idempotency-Key header must be 1-255 visible ASCII characters (a UUID, say)")
    scope = ""
    if request.app.state.tokens:  # the role check has verified the token already
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        scope = hashlib.sha256(token.encode()).hexdigest()
    return service.Once(scope, key, route)


def _traced(request: Request, requests: list[EnqueueRequest]) -> list[EnqueueRequest]:
    """`requests`, each without a traceparent of its own given the request's W3C `traceparent` header
    (and `tracestate`), as an HTTP client instrumented with OpenTelemetry sends them. A header that is not
    a valid traceparent is ignored, as W3C Trace Context asks; a tracestate is kept only if valid too."""
    traceparent, tracestate = trace_context(
        request.headers.get("traceparent"), request.headers.get("tracestate")
    )
    if traceparent is None:
        return requests
    trace = {"traceparent": traceparent, "tracestate": tracestate}
    return [r if r.traceparent is not None else r.model_copy(update=trace) for r in requests]


@router.post(
    "/jobs",
    status_code=201,
    dependencies=[Producer],
    response_model=None,
    responses=answers(EnqueuedJob, 409, 413, status=201)
    | {200: {"model": EnqueuedJob, "description": "A duplicate: the active job holding dedup_key"}},
    openapi_extra=IDEMPOTENCY_HEADER,
)
async def enqueue(body: EnqueueRequest, runtime: RuntimeDep, caller: Caller, request: Request) -> JSONBody:
    """Enqueue a job: 201 and the job; 200 and the active job holding its `dedup_key` (`duplicate`
    true) when one does."""
    caller.admit(body.queue)
    (body,) = _traced(request, [body])
    job = await service.enqueue(runtime, body, idempotency_of(request, "/jobs"), caller.like)
    return JSONBody(job, status_code=200 if job["duplicate"] or job.get("debounced") else 201)


@router.post(
    "/jobs/batch",
    dependencies=[Producer],
    status_code=201,
    response_model=None,
    responses=answers(EnqueueBatchResponse, 409, 413, status=201),
    openapi_extra=IDEMPOTENCY_HEADER,
)
async def enqueue_batch(
    body: EnqueueBatchRequest, runtime: RuntimeDep, caller: Caller, request: Request
) -> JSONBody:
    """Enqueue 1..1000 jobs, all or nothing; answers in request order."""
    if caller.queues is not None:
        for i, job in enumerate(body.jobs):
            caller.admit(job.queue, where=f"jobs[{i}].queue")
    answer = await service.enqueue_batch(
        runtime, _traced(request, body.jobs), once=idempotency_of(request, "/jobs/batch"), scope=caller.like
    )
    return JSONBody({"jobs": answer}, status_code=201)


@router.get("/jobs/{id}", dependencies=[Reader], response_model=None, responses=answers(Job, 404))
async def get_job(
    id: JobIdPath,
    runtime: RuntimeDep,
    caller: Caller,
    request: Request,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=60,
            description="Seconds to wait for the job to finish (completed, dead or cancelled) before "
            "answering; the answer is the job either way, so read its status. 0: answer at once.",
        ),
    ] = 0,
) -> JSONBody:
    """The job; a job of a queue the token may not use is 404, as if it did not exist. With `wait`, a
    long-poll: answered as soon as the job finishes, on whichever replica, or when `wait` runs out."""
    if wait <= 0:
        return JSONBody(await service.get_job(runtime.db, id, caller.like))
    return JSONBody(await service.wait_for_job(runtime, id, wait, caller.like, disconnected(request)))


@router.get(
    "/jobs/{id}/parents", dependencies=[Reader], response_model=None, responses=answers(ParentPage, 404)
)
async def get_parents(
    id: JobIdPath,
    db: DB,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=1000, description="Parents per page.")] = 100,
    after_id: Annotated[
        int, Query(ge=0, le=MAX_JOB_ID, description="Parents after this id (the last page's next_after_id).")
    ] = 0,
) -> JSONBody:
    """A page of the job's parents (depends_on) in id order: each one's id, kind, status and result. A job
    without parents has none; a job of a queue the token may not use is 404, as if it did not exist."""
    return JSONBody(await service.job_parents(db, id, limit, after_id, caller.like))


@router.delete("/jobs/{id}", dependencies=[Admin], response_model=None, responses=answers(Job, 404, 409))
async def cancel_job(id: JobIdPath, db: DB, caller: Caller) -> JSONBody:
    """Cancel a pending or waiting job (its own children are then decided); any other state is 409
    conflict."""
    return JSONBody(await service.cancel(db, id, caller.like))
