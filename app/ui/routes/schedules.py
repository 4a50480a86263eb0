"""The schedules' page and its buttons: pause, resume, trigger now."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from app.core.access import Role
from app.core.errors import JobqError
from app.core.limits import MAX_QUEUE_NAME, QUEUE_NAME_PATTERN
from app.http.auth import Caller
from app.http.deps import DB, RuntimeDep
from app.service import schedules
from app.ui import pages
from app.ui.routes.common import Flash, Next, SchedulePath, back, button_router, html, page_router, pressed

SCHEDULES_PAGE_SIZE = 100


viewed = page_router()


@viewed.get("/schedules", response_model=None)
async def schedules_page(
    db: DB,
    request: Request,
    caller: Caller,
    flash: Flash = None,
    after: Annotated[str | None, Query(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)] = None,
) -> Response:
    page = await schedules.list_schedules(db, caller.like, SCHEDULES_PAGE_SIZE, after)
    return html(request, pages.schedules_page(page, after=after, flash=flash, actions=caller.has(Role.ADMIN)))


buttons = button_router()


@buttons.post("/schedules/{name}/pause", response_model=None)
async def pause_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    done = f"Paused schedule {name}: it enqueues nothing until resumed."
    return await pressed(next, schedules.set_paused(db, name, True, caller.like), done)


@buttons.post("/schedules/{name}/resume", response_model=None)
async def resume_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    done = f"Resumed schedule {name}."
    return await pressed(next, schedules.set_paused(db, name, False, caller.like), done)


@buttons.post("/schedules/{name}/trigger", response_model=None)
async def trigger_schedule(
    name: SchedulePath, runtime: RuntimeDep, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    try:
        triggered = await schedules.trigger(runtime, name, caller.like)
    except JobqError as exc:
        return back(next, exc.detail)
    return back(
        next, f"Triggered schedule {name}: job {triggered['job_id']} enqueued in {triggered['queue']}."
    )
