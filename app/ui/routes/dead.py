"""The dead jobs' page and its buttons: retry and purge a dead job."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from app import service
from app.core.access import Role
from app.core.limits import MAX_JOB_ID, MAX_QUEUE_NAME
from app.http.auth import Caller
from app.http.deps import DB
from app.ui import pages
from app.ui.routes.common import (
    Flash,
    JobIdPath,
    Next,
    back,
    button_router,
    html,
    page_router,
    pressed,
    seen_queues,
)

DEAD_PAGE_SIZE = 50

viewed = page_router()


@viewed.get("/dead", response_model=None)
async def dead_page(
    db: DB,
    request: Request,
    caller: Caller,
    queue: Annotated[str | None, Query(max_length=MAX_QUEUE_NAME)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
    flash: Flash = None,
) -> Response:
    queue = queue or None  # the picker's "all queues" is an empty value
    if queue is not None:
        caller.admit(queue)
    page = await service.dead_jobs(db, queue, DEAD_PAGE_SIZE, before_id, caller.like)
    names = seen_queues(request, caller, queue)
    here = pages.url("/ui/dead", queue=queue, before_id=before_id)
    return html(
        request,
        pages.dead_page(
            page, queue=queue, queues=names, here=here, flash=flash, actions=caller.has(Role.ADMIN)
        ),
    )


buttons = button_router()


@buttons.post("/dead/{id}/retry", response_model=None)
async def retry_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/dead") -> Response:
    result = await service.retry_dead(db, [id], None, caller.like)
    if result["retried"]:
        return back(next, f"Retried job {id}: it is pending again.")
    if result["skipped"]:
        return back(next, f"Job {id} stays dead: an active job holds its dedup_key.")
    return back(next, f"Job {id} is not dead (any more): nothing to retry.")


@buttons.post("/dead/{id}/purge", response_model=None)
async def purge_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/dead") -> Response:
    return await pressed(next, service.purge_dead(db, id, caller.like), f"Purged job {id}.")
