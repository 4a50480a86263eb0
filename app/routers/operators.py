"""Operators: dead letters and queues."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app import jobs
from app.auth import Admin
from app.deps import DB, answers
from app.models import QUEUE_NAME_PATTERN
from app.schemas import (
    MAX_JOB_ID,
    DeadPage,
    PurgeResponse,
    QueueDetail,
    QueueRow,
    QueueSettingsPatch,
    RetryDeadRequest,
    RetryDeadResponse,
)
from app.web import JobqRoute, JSONBody

router = APIRouter(
    tags=["operators"], dependencies=[Admin], route_class=JobqRoute, default_response_class=JSONBody
)
QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=128)]


@router.get("/dead", response_model=None, responses=answers(DeadPage))
async def dead_jobs(
    db: DB,
    queue: Annotated[str | None, Query(pattern=QUEUE_NAME_PATTERN, max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
) -> JSONBody:
    """Dead jobs, newest first; pass `next_before_id` back as `before_id` for the next page."""
    return JSONBody(await jobs.dead_jobs(db, queue, limit, before_id))


@router.post("/dead/retry", response_model=None, responses=answers(RetryDeadResponse))
async def retry_dead(body: RetryDeadRequest, db: DB) -> JSONBody:
    """Dead jobs (by ids, by queue, or both) back to pending with attempts reset and run_at now."""
    return JSONBody(await jobs.retry_dead(db, body.ids, body.queue))


@router.delete("/dead/{id}", response_model=None, responses=answers(PurgeResponse, 404, 409))
async def purge_dead(id: Annotated[int, Path(ge=1, le=MAX_JOB_ID)], db: DB) -> JSONBody:
    return JSONBody(await jobs.purge_dead(db, id))


@router.get("/queues", response_model=None, responses=answers(list[QueueRow]))
async def queues(db: DB) -> JSONBody:
    return JSONBody(await jobs.queues(db))


@router.get("/queues/{queue}", response_model=None, responses=answers(QueueDetail, 404))
async def queue(queue: QueuePath, db: DB) -> JSONBody:
    return JSONBody(await jobs.queue(db, queue))


@router.patch("/queues/{queue}", response_model=None, responses=answers(QueueDetail))
async def configure_queue(queue: QueuePath, body: QueueSettingsPatch, db: DB) -> JSONBody:
    """Change some settings (creating the queue if need be); the rest keep their values."""
    return JSONBody(await jobs.configure_queue(db, queue, body))


@router.post("/queues/{queue}/pause", response_model=None, responses=answers(QueueRow))
async def pause(queue: QueuePath, db: DB) -> JSONBody:
    """Stop leasing from the queue (enqueues still land). Creates the queue if need be."""
    return JSONBody(await jobs.set_paused(db, queue, True))


@router.post("/queues/{queue}/resume", response_model=None, responses=answers(QueueRow))
async def resume(queue: QueuePath, db: DB) -> JSONBody:
    return JSONBody(await jobs.set_paused(db, queue, False))
