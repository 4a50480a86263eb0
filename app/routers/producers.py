"""Producers: enqueue, inspect and cancel jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app import jobs
from app.auth import Admin, Producer, Reader
from app.deps import DB, answers
from app.schemas import (
    MAX_JOB_ID,
    EnqueueBatchRequest,
    EnqueueBatchResponse,
    EnqueuedJob,
    EnqueueRequest,
    Job,
)
from app.web import JobqRoute, JSONBody

router = APIRouter(tags=["producers"], route_class=JobqRoute, default_response_class=JSONBody)
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]


@router.post(
    "/jobs",
    status_code=201,
    dependencies=[Producer],
    response_model=None,
    responses=answers(EnqueuedJob, 413, status=201)
    | {200: {"model": EnqueuedJob, "description": "A duplicate: the active job holding dedup_key"}},
)
async def enqueue(body: EnqueueRequest, db: DB) -> JSONBody:
    job = await jobs.enqueue_one(db, body)
    return JSONBody(job, status_code=200 if job["duplicate"] else 201)


@router.post(
    "/jobs/batch",
    dependencies=[Producer],
    status_code=201,
    response_model=None,
    responses=answers(EnqueueBatchResponse, 413, status=201),
)
async def enqueue_batch(body: EnqueueBatchRequest, db: DB) -> JSONBody:
    """Enqueue 1..1000 jobs, all or nothing; answers in request order."""
    return JSONBody({"jobs": await jobs.enqueue(db, body.jobs)}, status_code=201)


@router.get("/jobs/{id}", dependencies=[Reader], response_model=None, responses=answers(Job, 404))
async def get_job(id: JobIdPath, db: DB) -> JSONBody:
    return JSONBody(await jobs.get_job(db, id))


@router.delete("/jobs/{id}", dependencies=[Admin], response_model=None, responses=answers(Job, 404, 409))
async def cancel(id: JobIdPath, db: DB) -> JSONBody:
    """Cancel a pending job; any other state is 409 conflict."""
    return JSONBody(await jobs.cancel(db, id))
