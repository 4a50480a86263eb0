"""Durable steps, sleeps and events (API part 8, app/service/durable.py): a worker records a step's result
under its lease, or parks its job until an event; producers (and workers) send events. A sleep is an item
of POST /release with a `delay` (app/http/routers/workers.py).

A step and an await name a job and its lease token, which only that lease handed out: the token fences them,
as it fences an ack. An event from a token limited to some queues reaches only jobs in them, and GET
/events shows such a token only the events sent under its own queues."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.core.access import Role
from app.core.limits import MAX_JOB_ID, NO_NUL
from app.http.auth import Caller, Reader, Worker, allow
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.schemas import (
    Awaited,
    AwaitRequest,
    EventPage,
    EventRequest,
    EventSent,
    StepRecorded,
    StepRequest,
)
from app.http.schemas.durable import MAX_EVENT_NAME
from app.http.web import JSONBody
from app.service import durable

router = APIRouter(
    tags=["durable"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]
Sender = allow(Role.PRODUCER, Role.WORKER)


@router.post(
    "/jobs/{id}/steps",
    dependencies=[Worker],
    response_model=None,
    responses=answers(StepRecorded, 404, 409, 413),
)
async def record_step(id: JobIdPath, body: StepRequest, runtime: RuntimeDep) -> JSONBody:
    """Record a step's result with the job, under its current lease (a stale token is 409 lease_lost and
    records nothing). A name recorded already is 409 conflict with the recorded `result`: the first write
    wins. Every later lease of the job carries its steps."""
    return JSONBody(await durable.record_step(runtime, id, body.lease_token, body.name, body.result))


@router.post(
    "/jobs/{id}/await", dependencies=[Worker], response_model=None, responses=answers(Awaited, 404, 409)
)
async def await_event(id: JobIdPath, body: AwaitRequest, runtime: RuntimeDep) -> JSONBody:
    """End the lease and park the job `waiting` for an event of that name, for at most `timeout` seconds
    (then it is pending again without it); the attempt is not counted. When such an event was sent since
    the job was enqueued and has not reached it yet, the job is not parked but pending at once, with it."""
    return JSONBody(await durable.await_event(runtime, id, body.lease_token, body.event, body.timeout))


@router.post("/events", dependencies=[Sender], response_model=None, responses=answers(EventSent, 413))
async def send_event(body: EventRequest, runtime: RuntimeDep, caller: Caller) -> JSONBody:
    """Send an event: every job awaiting its name becomes pending at once, the event in its `events`;
    kept for JOBQ_EVENT_RETENTION, so that a job enqueued before it that awaits it later finds it."""
    return JSONBody(await durable.send_event(runtime, body.name, body.payload, caller.like))


@router.get("/events", dependencies=[Reader], response_model=None, responses=answers(EventPage))
async def list_events(
    db: DB,
    caller: Caller,
    name: Annotated[
        str | None,
        Query(
            min_length=1, max_length=MAX_EVENT_NAME, pattern=NO_NUL, description="Only events of this name."
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
) -> JSONBody:
    """The events kept, newest first, page by page (`before_id` from the last page's `next_before_id`)."""
    return JSONBody(await durable.list_events(db, name, limit, before_id, caller.like))
