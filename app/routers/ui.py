"""The dashboard under /ui: queues (depth, lag, throughput, pause and resume), dead jobs (retry, purge),
schedules (pause, resume, trigger now) and a job's page, rendered on the server from the same service
layer (``app.jobs``) the JSON API uses.

Every page, button and static file of the dashboard is a route of this one router, so the one
dependency attached to it covers the whole dashboard: with tokens configured, it is for viewers and
admins (``Authorization: Bearer <token>``, e.g. added by the proxy in front of it). The buttons are
admins' only: a viewer's pages show none, and its posts are refused (403). A token limited to some
queues (app/access.py) sees those queues, their jobs and the schedules that enqueue into them only.
Posts that a page of another site makes the browser send are refused before they get here, as for
every route (app/origin.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path as FilePath
from typing import Annotated
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from app import jobs
from app.access import Role
from app.auth import Admin, Caller, Viewer
from app.deps import DB
from app.errors import JobqError, NotFound
from app.jobs import flow, schedules
from app.models import MAX_JOB_ID, MAX_QUEUE_NAME, QUEUE_NAME_PATTERN
from app.ui import pages

router = APIRouter(prefix="/ui", include_in_schema=False, dependencies=[Viewer])

QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]
# Schedule names have the queue names' rules (docs of PUT /schedules/{name}).
SchedulePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
Flash = Annotated[str | None, Query(max_length=500)]
Next = Annotated[str, Query(max_length=2000)]
DEAD_PAGE_SIZE = 50

STATIC = FilePath(__file__).resolve().parent.parent / "ui" / "static"
STATIC_TYPES = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}

# The pages load nothing from elsewhere, run no inline script and may not be framed (their buttons
# change state).
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=HEADERS)


def back(next_page: str, flash: str) -> RedirectResponse:
    """Post/redirect/get: back to the dashboard page the button was on, with a notice."""
    parts = urlsplit(next_page)
    if not parts.path.startswith("/ui") or parts.scheme or parts.netloc:
        parts = urlsplit("/ui")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flash"] + [("flash", flash)]
    return RedirectResponse(urlunsplit(("", "", parts.path, urlencode(query), "")), status_code=303)


# --- pages -----------------------------------------------------------------------------------------


@router.get("", response_model=None)
async def queues_page(db: DB, request: Request, caller: Caller, flash: Flash = None) -> Response:
    metrics = request.app.state.metrics
    # The metrics' query, not GET /queues': it reads only waiting, running and dead jobs, so a page
    # that refreshes itself every few seconds stays cheap however many completed jobs are kept.
    rows = [row for row in await jobs.queue_gauges(db) if caller.admits(row["queue"])]
    return html(
        pages.queues_page(
            rows, metrics.throughput(), metrics.gauges, flash=flash, actions=caller.has(Role.ADMIN)
        )
    )


@router.get("/dead", response_model=None)
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
    page = await jobs.dead_jobs(db, queue, DEAD_PAGE_SIZE, before_id, caller.like)
    # The picker lists the queues the metrics last saw (refreshed every few seconds), not a fresh scan.
    seen = {row["queue"] for row in request.app.state.metrics.gauges.queues}
    names = sorted({name for name in seen if caller.admits(name)} | ({queue} - {None}))
    here = pages.url("/ui/dead", queue=queue, before_id=before_id)
    return html(
        pages.dead_page(
            page, queue=queue, queues=names, here=here, flash=flash, actions=caller.has(Role.ADMIN)
        )
    )


@router.get("/jobs", response_model=None)
async def find_job(id: Annotated[str, Query(max_length=30)] = "") -> Response:
    """The header's job lookup."""
    text = id.strip().lstrip("#")
    if not text.isdigit() or not 1 <= int(text) <= MAX_JOB_ID:
        return html(pages.not_found_page(f"{id!r} is not a job id"), status=404)
    return RedirectResponse(f"/ui/jobs/{int(text)}", status_code=303)


@router.get("/jobs/{id}", response_model=None)
async def job_page(id: JobIdPath, db: DB, caller: Caller, flash: Flash = None) -> Response:
    try:
        job = await jobs.get_job(db, id, caller.like)
    except NotFound as exc:
        return html(pages.not_found_page(exc.detail), status=404)
    return html(pages.job_page(job, flash=flash, actions=caller.has(Role.ADMIN)))


@router.get("/queues/{queue}/keys", response_model=None)
async def keys_page(queue: QueuePath, db: DB, caller: Caller) -> Response:
    caller.admit(queue)
    row = next((r for r in await jobs.queue_gauges(db) if r["queue"] == queue), None)
    keys = await flow.list_keys(db, queue, pages.KEYS_SHOWN)
    return html(pages.keys_page(queue, pages.limits_text(row) if row else "", keys))


@router.get("/schedules", response_model=None)
async def schedules_page(db: DB, caller: Caller, flash: Flash = None) -> Response:
    listed = await schedules.list_schedules(db, caller.like)
    return html(pages.schedules_page(listed, flash=flash, actions=caller.has(Role.ADMIN)))


@router.get("/static/{name}", response_model=None)
async def static(name: str) -> Response:
    if name not in STATIC_TYPES:
        raise HTTPException(404, f"no dashboard file {name!r}")
    return Response(_static_file(name), media_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


@cache
def _static_file(name: str) -> bytes:
    return (STATIC / name).read_bytes()


# --- buttons ---------------------------------------------------------------------------------------

# Admins' only (a viewer's pages show no button); their cross-site posts are refused by app/origin.py.
buttons = APIRouter(dependencies=[Admin])


@buttons.post("/queues/{queue}/pause", response_model=None)
async def pause(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await jobs.set_paused(db, queue, True)
    return back(next, f"Paused {queue}: it leases nothing until resumed.")


@buttons.post("/queues/{queue}/resume", response_model=None)
async def resume(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await jobs.set_paused(db, queue, False)
    return back(next, f"Resumed {queue}.")


@buttons.post("/queues/{queue}/retry-dead", response_model=None)
async def retry_queue(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    result = await jobs.retry_dead(db, None, queue)
    kept = len(result["skipped"])
    skipped = f"; {kept} kept dead (dedup_key held by an active job)" if kept else ""
    return back(next, f"Retried {result['retried']} dead jobs of {queue}{skipped}.")


@buttons.post("/dead/{id}/retry", response_model=None)
async def retry_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/dead") -> Response:
    result = await jobs.retry_dead(db, [id], None, caller.like)
    if result["retried"]:
        return back(next, f"Retried job {id}: it is pending again.")
    if result["skipped"]:
        return back(next, f"Job {id} stays dead: an active job holds its dedup_key.")
    return back(next, f"Job {id} is not dead (any more): nothing to retry.")


@buttons.post("/dead/{id}/purge", response_model=None)
async def purge_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/dead") -> Response:
    try:
        await jobs.purge_dead(db, id, caller.like)
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, f"Purged job {id}.")


@buttons.post("/schedules/{name}/pause", response_model=None)
async def pause_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    try:
        await schedules.set_paused(db, name, True, caller.like)
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, f"Paused schedule {name}: it enqueues nothing until resumed.")


@buttons.post("/schedules/{name}/resume", response_model=None)
async def resume_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    try:
        await schedules.set_paused(db, name, False, caller.like)
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, f"Resumed schedule {name}.")


@buttons.post("/schedules/{name}/trigger", response_model=None)
async def trigger_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    try:
        triggered = await schedules.trigger(db, name, caller.like)
    except JobqError as exc:
        return back(next, exc.detail)
    return back(
        next, f"Triggered schedule {name}: job {triggered['job_id']} enqueued in {triggered['queue']}."
    )


router.include_router(buttons)
