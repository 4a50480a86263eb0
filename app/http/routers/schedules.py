"""Schedules: cron schedules that enqueue a job per slot (app/service/schedules.py).

Reading them is for any role that reads jobs; changing, pausing and triggering them is for admins. A
token limited to some queues sees and changes only the schedules of those queues, and may not point one
at another queue. The schedules JOBQ_SCHEDULES_FILE declares are checked here too (`declared`), as a PUT
checks one."""

from __future__ import annotations

import re
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import ValidationError

from app.core.limits import MAX_QUEUE_NAME, QUEUE_NAME_PATTERN
from app.http.auth import Admin, Caller, Reader
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.schemas import DeletedSchedule, Schedule, ScheduleList, ScheduleRequest, TriggeredSchedule
from app.http.web import JSONBody
from app.service import schedules

router = APIRouter(
    tags=["schedules"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
ScheduleName = Annotated[
    str,
    Path(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=MAX_QUEUE_NAME, examples=["nightly-report"]),
]


@router.get("/schedules", dependencies=[Reader], response_model=None, responses=answers(ScheduleList))
async def list_schedules(
    db: DB,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=schedules.MAX_LISTED)] = schedules.MAX_LISTED,
    after: Annotated[
        str | None, Query(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=MAX_QUEUE_NAME)
    ] = None,
) -> JSONBody:
    """Schedules by name, a page of `limit` (default and at most 1,000); pass `next_after` back as
    `after` for the next page."""
    return JSONBody(await schedules.list_schedules(db, caller.like, limit, after))


@router.get("/schedules/{name}", dependencies=[Reader], response_model=None, responses=answers(Schedule, 404))
async def get_schedule(name: ScheduleName, db: DB, caller: Caller) -> JSONBody:
    """One schedule, with its next and last run."""
    return JSONBody(await schedules.get_schedule(db, name, caller.like))


@router.put("/schedules/{name}", dependencies=[Admin], response_model=None, responses=answers(Schedule))
async def put_schedule(name: ScheduleName, body: ScheduleRequest, db: DB, caller: Caller) -> JSONBody:
    """Create or replace a schedule. Its next slot is kept when cron and time zone are unchanged."""
    caller.admit(body.queue)
    return JSONBody(
        await schedules.put_schedule(db, name, schedules.ScheduleSpec(**body.model_dump()), caller.like)
    )


def declared(path: FilePath) -> dict[str, schedules.ScheduleSpec]:
    """The schedules JOBQ_SCHEDULES_FILE declares, checked as PUT /schedules/{name} checks them; a
    ValueError naming the file, the schedule and what is wrong otherwise."""
    try:
        tables = schedules.load_file(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"JOBQ_SCHEDULES_FILE: {exc}") from None
    specs = {}
    for name, fields in tables.items():
        if not re.fullmatch(QUEUE_NAME_PATTERN, name):
            raise ValueError(f"{path}: schedule name {name!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
        try:
            body = ScheduleRequest.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'schedule'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{path}: schedule {name!r}: {problems}") from None
        specs[name] = schedules.ScheduleSpec(**body.model_dump())
    return specs


@router.delete(
    "/schedules/{name}", dependencies=[Admin], response_model=None, responses=answers(DeletedSchedule, 404)
)
async def delete_schedule(name: ScheduleName, db: DB, caller: Caller) -> JSONBody:
    """Remove a schedule; the jobs it enqueued stay."""
    return JSONBody(await schedules.delete_schedule(db, name, caller.like))


@router.post(
    "/schedules/{name}/pause", dependencies=[Admin], response_model=None, responses=answers(Schedule, 404)
)
async def pause_schedule(name: ScheduleName, db: DB, caller: Caller) -> JSONBody:
    """Stop firing; nothing of the pause is caught up on resume."""
    return JSONBody(await schedules.set_paused(db, name, True, caller.like))


@router.post(
    "/schedules/{name}/resume", dependencies=[Admin], response_model=None, responses=answers(Schedule, 404)
)
async def resume_schedule(name: ScheduleName, db: DB, caller: Caller) -> JSONBody:
    """Fire again, from the first slot after now."""
    return JSONBody(await schedules.set_paused(db, name, False, caller.like))


@router.post(
    "/schedules/{name}/trigger",
    dependencies=[Admin],
    response_model=None,
    responses=answers(TriggeredSchedule, 404),
)
async def trigger_schedule(name: ScheduleName, runtime: RuntimeDep, caller: Caller) -> JSONBody:
    """Enqueue the schedule's job now (its `schedule_slot` is null); the schedule, with `job_id`."""
    return JSONBody(await schedules.trigger(runtime, name, caller.like))
