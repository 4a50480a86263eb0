"""The jobs' pages (the list, a job with its parents and children) and their buttons: cancel a job or run it
now, and retry, purge or cancel a selection of jobs or every job the filters match.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response
from fastapi.responses import RedirectResponse

from app import service
from app.core.access import Role
from app.core.errors import JobqError, NotFound
from app.core.limits import KIND_PATTERN, MAX_JOB_ID, MAX_KEY, MAX_KIND, MAX_QUEUE_NAME, MAX_SEARCH, NO_NUL
from app.core.states import JobStatus
from app.http.auth import Caller
from app.http.deps import DB
from app.http.problems import status_of
from app.service.parents import job_children
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
    read_form,
    seen_queues,
)

JOBS_PAGE_SIZE = 50

# A job list's status filter: one of the statuses, or empty (the picker's "any status").
ANY_STATUS = f"^(|{'|'.join(JobStatus)})$"
SELECTED_AT_MOST = 500  # jobs per bulk action on a selection


viewed = page_router()


@viewed.get("/jobs", response_model=None)
async def jobs_page(
    db: DB,
    request: Request,
    caller: Caller,
    id: Annotated[str | None, Query(max_length=30)] = None,
    queue: Annotated[str | None, Query(max_length=MAX_QUEUE_NAME)] = None,
    status: Annotated[str | None, Query(pattern=ANY_STATUS)] = None,
    kind: Annotated[str | None, Query(pattern=f"^$|{KIND_PATTERN}", max_length=MAX_KIND)] = None,
    key: Annotated[str | None, Query(pattern=NO_NUL, max_length=MAX_KEY)] = None,
    q: Annotated[str | None, Query(pattern=NO_NUL, max_length=MAX_SEARCH)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
    flash: Flash = None,
) -> Response:
    """Jobs of any state, filtered (the form's empty fields are no filter); with `id`, the header's job
    lookup."""
    if id is not None:
        text = id.strip().lstrip("#")
        if not text.isdigit() or not 1 <= int(text) <= MAX_JOB_ID:
            return html(request, pages.not_found_page(f"{id!r} is not a job id"), status=404)
        return RedirectResponse(f"/ui/jobs/{int(text)}", status_code=303)
    given = {"queue": queue, "status": status, "kind": kind, "key": key, "q": q}
    filters = {name: value or None for name, value in given.items()}
    if filters["queue"] is not None:
        caller.admit(filters["queue"])
    try:
        page = await service.list_jobs(
            db,
            queue=filters["queue"],
            status=filters["status"],
            kind=filters["kind"],
            key=filters["key"],
            search=filters["q"],
            limit=JOBS_PAGE_SIZE,
            before_id=before_id,
            scope=caller.like,
        )
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=status_of(exc))
    return html(
        request,
        pages.jobs_page(
            page,
            filters=filters,
            queues=seen_queues(request, caller, filters["queue"]),
            here=pages.url("/ui/jobs", **filters, before_id=before_id),
            flash=flash,
            actions=caller.has(Role.ADMIN),
        ),
    )


@viewed.get("/jobs/{id}", response_model=None)
async def job_page(id: JobIdPath, db: DB, request: Request, caller: Caller, flash: Flash = None) -> Response:
    """A job, with the first RELATIVES_SHOWN of its parents and of its children."""
    shown = pages.RELATIVES_SHOWN
    try:
        job = await service.get_job(db, id, caller.like)
        parents = await service.job_parents(db, id, shown, 0, caller.like) if job.get("depends_on") else None
        children = await job_children(db, id, shown, 0, caller.like)
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=status_of(exc))
    return html(
        request,
        pages.job_page(job, parents=parents, children=children, flash=flash, actions=caller.has(Role.ADMIN)),
    )


buttons = button_router()


@buttons.post("/jobs/{id}/cancel", response_model=None)
async def cancel_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/jobs") -> Response:
    return await pressed(next, service.cancel(db, id, caller.like), f"Cancelled job {id}: it will not run.")


@buttons.post("/jobs/{id}/run", response_model=None)
async def run_job_now(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/jobs") -> Response:
    done = f"Job {id} is ready now: the next lease of its queue can take it."
    return await pressed(next, service.run_now(db, id, caller.like), done)


async def _act(db: DB, caller: Caller, action: str, ids: list[int]) -> tuple[int, int]:
    """Carry out a bulk action on `ids`: how many it changed, and how many it left (another status)."""
    if action == "retry":
        done = (await service.retry_dead(db, ids, None, caller.like))["retried"]
    elif action == "purge":
        done = len(await service.purge_dead_jobs(db, ids, caller.like))
    else:
        done = len(await service.cancel_jobs(db, ids, caller.like))
    return done, len(ids) - done


def _done_text(action: str, done: int, left: int, what: str) -> str:
    applies, label = pages.BULK[action]
    past = {"retry": "Retried", "purge": "Purged", "cancel": "Cancelled"}[action]
    text = f"{past} {done} {what}."
    if left:
        text += f" {left} left as they were: only {applies} jobs can be {past.lower()}"
        text += " (or a retried job's dedup_key is held by an active job)." if action == "retry" else "."
    return text


@buttons.post("/jobs/selected", response_model=None)
async def act_on_selected(request: Request, db: DB, caller: Caller, next: Next = "/ui/jobs") -> Response:
    """A bulk action on the jobs ticked in a list (the form's `id` fields), named by the button pressed."""
    fields = await read_form(request)
    action = dict(fields).get("action", "")
    ids = [int(v) for k, v in fields if k == "id" and v.isdigit() and 1 <= int(v) <= MAX_JOB_ID]
    if action not in pages.BULK:
        return back(next, "Choose an action: retry, purge or cancel.")
    if not ids:
        return back(next, "Tick the jobs to act on first.")
    if len(ids) > SELECTED_AT_MOST:
        return back(
            next, f"At most {SELECTED_AT_MOST} jobs at once; use the 'all matching' buttons for more."
        )
    done, left = await _act(db, caller, action, ids)
    return back(next, _done_text(action, done, left, f"of {len(ids)} selected jobs"))


@buttons.post("/jobs/matching", response_model=None)
async def act_on_matching(
    db: DB,
    caller: Caller,
    action: Annotated[str, Query(pattern="^(retry|purge|cancel)$")],
    status: Annotated[str, Query(pattern="^(pending|dead)$")],
    queue: Annotated[str | None, Query(max_length=MAX_QUEUE_NAME)] = None,
    kind: Annotated[str | None, Query(pattern=KIND_PATTERN, max_length=MAX_KIND)] = None,
    key: Annotated[str | None, Query(pattern=NO_NUL, max_length=MAX_KEY)] = None,
    q: Annotated[str | None, Query(pattern=NO_NUL, max_length=MAX_SEARCH)] = None,
    next: Next = "/ui/jobs",
) -> Response:
    """A bulk action on every job of `status` the filters match, page by page (service.every_match)."""
    if pages.BULK[action][0] != status:
        return back(
            next, f"{pages.BULK[action][1]} applies to {pages.BULK[action][0]} jobs, not {status} ones."
        )
    if queue is not None:
        caller.admit(queue)
    done = left = 0
    try:
        async for ids in service.every_match(
            db, queue=queue, status=status, kind=kind, key=key, search=q, scope=caller.like
        ):
            changed, kept = await _act(db, caller, action, ids)
            done, left = done + changed, left + kept
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, _done_text(action, done, left, f"{status} jobs matching the filters"))
