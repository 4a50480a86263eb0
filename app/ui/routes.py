"""The dashboard under /ui: queues (depth, lag, throughput, pause and resume) and each queue's page (its
jobs by state, its settings, editable by admins), jobs of any state (filters, search, bulk retry, purge
and cancel, of a selection or of every match), dead jobs (retry, purge), schedules (pause, resume,
trigger now), workers (what each holds, when last seen) and a job's page (cancel, run now, retry,
purge), rendered on the server from the same service layer (``app.service``) the JSON API uses.

Every page and button of the dashboard is a route of `viewed` or `buttons` below, and each carries its
role check: with tokens configured, the pages are for viewers and admins, the buttons for admins only (a
viewer's pages show none, and its posts are refused, 403). A caller is known by its `Authorization:
Bearer <token>` header (a script, or a proxy in front adding it), else by the session cookie that the
sign-in form gives a browser for a token (app/ui/session.py); a browser with neither is sent to the
sign-in form. A token limited to some queues (app/core/access.py) sees those queues, their jobs and the
schedules that enqueue into them only, through a session as well. The sign-in form, sign-out and the
static files need no token. Posts that a page of another site makes the browser send, the sign-in
form's included, are refused before they get here, as for every route (app/http/middleware/origin.py).
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path as FilePath
from typing import Annotated
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError

from app import service
from app.core.access import Admits, Role
from app.core.errors import JobqError, NotFound, PayloadTooLarge, Unauthorized
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
from app.http.auth import GRANT, Caller
from app.http.deps import DB, RuntimeDep
from app.http.schemas import QueueSettingsPatch
from app.http.web import read_body
from app.service import flow, schedules
from app.ui import pages
from app.ui.session import COOKIE, PATH

router = APIRouter(include_in_schema=False)

QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]
# Schedule names have the queue names' rules (docs of PUT /schedules/{name}).
SchedulePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
Flash = Annotated[str | None, Query(max_length=500)]
Next = Annotated[str, Query(max_length=2000)]
DEAD_PAGE_SIZE = 50
JOBS_PAGE_SIZE = 50
SCHEDULES_PAGE_SIZE = 100
# A job list's status filter: one of the statuses, or empty (the picker's "any status").
ANY_STATUS = f"^(|{'|'.join(JobStatus)})$"
SELECTED_AT_MOST = 500  # jobs per bulk action on a selection
# A posted form's limits: a selection of SELECTED_AT_MOST jobs is 500 `id` fields of at most 20 bytes.
FORM_MAX_BYTES = 64 * 1024
FORM_MAX_FIELDS = 1000

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


# Where a caller that came with a session cookie is noted, in the request's ASGI scope: its pages get
# a Sign out button.
SESSION = "jobq.session"


def html(request: Request, text: str, status: int = 200) -> HTMLResponse:
    if request.scope.get(SESSION):
        text = pages.with_sign_out(text)
    return HTMLResponse(text, status_code=status, headers=HEADERS)


def within(next_page: str) -> str:
    """`next_page` if it is a page of the dashboard (a path under /ui, nothing naming another site),
    else /ui: where a form may send the browser afterwards."""
    parts = urlsplit(next_page)
    if parts.scheme or parts.netloc or not (parts.path == "/ui" or parts.path.startswith("/ui/")):
        return "/ui"
    return urlunsplit(("", "", parts.path, parts.query, ""))


def back(next_page: str, flash: str) -> RedirectResponse:
    """Post/redirect/get: back to the dashboard page the button was on, with a notice."""
    parts = urlsplit(within(next_page))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flash"] + [("flash", flash)]
    return RedirectResponse(urlunsplit(("", "", parts.path, urlencode(query), "")), status_code=303)


# --- who is calling --------------------------------------------------------------------------------


def dashboard(*roles: Role) -> object:
    """The role check of dashboard routes, admitting `roles` (admins always). The caller is its
    Authorization header's token when it sends one, else its session cookie's token; with neither (or
    a session that has ended), a browser asking for a page is sent to sign in, anything else is 401."""
    admits = Admits(*roles)

    async def check(request: Request) -> None:
        tokens = request.app.state.tokens
        authorization = request.headers.get("authorization")
        if authorization is not None or not tokens:
            request.scope[GRANT] = admits.check(tokens, authorization or "")
            return
        cookie = request.cookies.get(COOKIE)
        grant = request.app.state.sessions.grant_of(cookie) if cookie else None
        if grant is None:
            raise _sign_in_first(request, ended=cookie is not None)
        request.scope[GRANT] = admits.admit(grant)
        request.scope[SESSION] = True

    return Depends(check)


def _sign_in_first(request: Request, ended: bool) -> Exception:
    """To the sign-in form for a browser (what asks for HTML), coming back afterwards to the page it
    asked for, or for a button's post (not carried out) to the page the button was on; 401 for programs.
    """
    if "text/html" not in request.headers.get("accept", ""):
        return Unauthorized("sign in at /ui/sign-in, or send Authorization: Bearer <token>")
    if request.method == "GET":
        here = urlunsplit(("", "", request.url.path, request.url.query, ""))
    else:
        here = within(request.query_params.get("next", "/ui"))
    headers = {"Location": pages.url("/ui/sign-in", next=here, ended="1" if ended else None)}
    if ended:  # an expired, altered or revoked session: the browser may as well forget it
        headers["Set-Cookie"] = _cleared_cookie(request)
    return HTTPException(303, "sign in first", headers=headers)


def _cleared_cookie(request: Request) -> str:
    gone = Response()
    gone.delete_cookie(
        COOKIE, path=PATH, secure=request.url.scheme == "https", httponly=True, samesite="strict"
    )
    return gone.headers["set-cookie"]


# Pages for viewers and admins; buttons (below) for admins.
viewed = APIRouter(prefix="/ui", dependencies=[dashboard(Role.VIEWER)])


# --- pages -----------------------------------------------------------------------------------------


@viewed.get("", response_model=None)
async def queues_page(db: DB, request: Request, caller: Caller, flash: Flash = None) -> Response:
    metrics = request.app.state.metrics
    # The metrics' query, not GET /queues': it reads only waiting, running and dead jobs, so a page
    # that refreshes itself every few seconds stays cheap however many completed jobs are kept.
    rows = [row for row in await service.queue_gauges(db) if caller.admits(row["queue"])]
    completed = await service.completed_lately(db, caller.like)
    return html(
        request,
        pages.queues_page(
            rows,
            metrics.throughput(),
            metrics.gauges,
            completed=completed,
            flash=flash,
            actions=caller.has(Role.ADMIN),
        ),
    )


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
    names = _seen_queues(request, caller, queue)
    here = pages.url("/ui/dead", queue=queue, before_id=before_id)
    return html(
        request,
        pages.dead_page(
            page, queue=queue, queues=names, here=here, flash=flash, actions=caller.has(Role.ADMIN)
        ),
    )


def _seen_queues(request: Request, caller: Caller, *also: str | None) -> list[str]:
    """The queues a picker lists: those the metrics last saw (refreshed every few seconds, not a fresh
    scan) that the caller may see, and `also`."""
    seen = {row["queue"] for row in request.app.state.metrics.gauges.queues}
    return sorted({name for name in seen if caller.admits(name)} | {name for name in also if name})


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
        return html(request, pages.not_found_page(exc.detail), status=404)
    return html(
        request,
        pages.jobs_page(
            page,
            filters=filters,
            queues=_seen_queues(request, caller, filters["queue"]),
            here=pages.url("/ui/jobs", **filters, before_id=before_id),
            flash=flash,
            actions=caller.has(Role.ADMIN),
        ),
    )


@viewed.get("/queues/{queue}", response_model=None)
async def queue_page(
    queue: QueuePath,
    db: DB,
    request: Request,
    caller: Caller,
    span: Annotated[str, Query(pattern="^(1h|1d|7d)$")] = "1h",
    flash: Flash = None,
) -> Response:
    caller.admit(queue)
    try:
        row = await service.queue(db, queue)
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=404)
    row["cancelled"] = await service.queue_cancelled(db, queue)
    charts = pages.queue_charts(queue, await service.rollup_series(db, queue, span), span, datetime.now(UTC))
    return html(request, pages.queue_page(row, charts=charts, flash=flash, actions=caller.has(Role.ADMIN)))


@viewed.get("/jobs/{id}", response_model=None)
async def job_page(id: JobIdPath, db: DB, request: Request, caller: Caller, flash: Flash = None) -> Response:
    try:
        job = await service.get_job(db, id, caller.like)
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=404)
    return html(request, pages.job_page(job, flash=flash, actions=caller.has(Role.ADMIN)))


@viewed.get("/queues/{queue}/keys", response_model=None)
async def keys_page(queue: QueuePath, db: DB, request: Request, caller: Caller) -> Response:
    caller.admit(queue)
    row = next((r for r in await service.queue_gauges(db) if r["queue"] == queue), None)
    keys = await flow.list_keys(db, queue, pages.KEYS_SHOWN)
    return html(request, pages.keys_page(queue, pages.limits_text(row) if row else "", keys))


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


@viewed.get("/workers", response_model=None)
async def workers_page(db: DB, request: Request, caller: Caller) -> Response:
    return html(request, pages.workers_page(await service.list_workers(db, caller.like)))


@router.get("/ui/static/{name}", response_model=None)
async def static(name: str) -> Response:
    if name not in STATIC_TYPES:
        raise HTTPException(404, f"no dashboard file {name!r}")
    return Response(_static_file(name), media_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


@cache
def _static_file(name: str) -> bytes:
    return (STATIC / name).read_bytes()


# --- signing in ------------------------------------------------------------------------------------


@router.get("/ui/sign-in", response_model=None)
async def sign_in_page(
    request: Request, next: Next = "/ui", ended: bool = False, flash: Flash = None
) -> Response:
    if not request.app.state.tokens:  # nothing to sign in to: the dashboard is open
        return RedirectResponse(within(next), status_code=303)
    if ended and flash is None:
        flash = "Your session has ended: sign in again."
    # A link from another site (an alert, a chat) brings no SameSite=Strict cookie, even to a browser
    # signed in: a link of this page does.
    linked = request.headers.get("sec-fetch-site") == "cross-site"
    max_age = request.app.state.sessions.max_age
    return html(request, pages.sign_in_page(within(next), max_age, flash=flash, linked=linked))


@router.post("/ui/sign-in", response_model=None)
async def sign_in(request: Request) -> Response:
    """The sign-in form: a token of a viewer or an admin becomes a session cookie, and the browser goes
    on to the page it was sent from."""
    fields = dict(await _form(request))
    token, target = fields.get("token", "").strip(), within(fields.get("next", "/ui"))
    tokens, sessions = request.app.state.tokens, request.app.state.sessions
    if not tokens:
        return RedirectResponse(target, status_code=303)
    grant = tokens.grant_of(token) if token else None
    if grant is None or not grant.has(Role.VIEWER):
        if not token:
            refused, status = "Enter a token: one with the viewer or admin role.", 400
        elif grant is None:
            refused, status = "That token is not one of this service's tokens (JOBQ_TOKENS).", 401
        else:
            held = ", ".join(role for role in Role if role in grant.roles)
            refused = f"A token of role {held} cannot open the dashboard: it takes a viewer or admin token."
            status = 403
        return html(request, pages.sign_in_page(target, sessions.max_age, flash=refused), status=status)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        sessions.cookie_for(token),
        max_age=sessions.max_age,
        path=PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/ui/sign-out", response_model=None)
async def sign_out(request: Request) -> Response:
    response = RedirectResponse(pages.url("/ui/sign-in", flash="Signed out."), status_code=303)
    response.headers["Set-Cookie"] = _cleared_cookie(request)
    return response


# --- buttons ---------------------------------------------------------------------------------------

# Admins' only (a viewer's pages show no button); their cross-site posts are refused by
# app/http/middleware/origin.py.
buttons = APIRouter(prefix="/ui", dependencies=[dashboard()])


async def _pressed(next: str, action: Awaitable[object], done: str) -> RedirectResponse:
    """A button's answer: back to its page with `done` once `action` has run, or with why it was refused
    (a job in another state, a schedule that does not exist)."""
    try:
        await action
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, done)


@buttons.post("/queues/{queue}/pause", response_model=None)
async def pause(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await service.set_paused(db, queue, True)
    return back(next, f"Paused {queue}: it leases nothing until resumed.")


@buttons.post("/queues/{queue}/resume", response_model=None)
async def resume(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await service.set_paused(db, queue, False)
    return back(next, f"Resumed {queue}.")


@buttons.post("/queues/{queue}/retry-dead", response_model=None)
async def retry_queue(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    result = await service.retry_dead(db, None, queue)
    kept = len(result["skipped"])
    skipped = f"; {kept} kept dead (dedup_key held by an active job)" if kept else ""
    return back(next, f"Retried {result['retried']} dead jobs of {queue}{skipped}.")


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
    return await _pressed(next, service.purge_dead(db, id, caller.like), f"Purged job {id}.")


@buttons.post("/jobs/{id}/cancel", response_model=None)
async def cancel_job(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/jobs") -> Response:
    return await _pressed(next, service.cancel(db, id, caller.like), f"Cancelled job {id}: it will not run.")


@buttons.post("/jobs/{id}/run", response_model=None)
async def run_job_now(id: JobIdPath, db: DB, caller: Caller, next: Next = "/ui/jobs") -> Response:
    done = f"Job {id} is ready now: the next lease of its queue can take it."
    return await _pressed(next, service.run_now(db, id, caller.like), done)


def _rate(fields: dict[str, str], name: str) -> dict[str, float] | None:
    """A rate from the settings form's two fields (`{name}_limit` per `{name}_period` seconds); None
    when the limit is left empty. ValueError for text that is not a number."""
    limit = fields.get(f"{name}_limit", "").strip()
    if not limit:
        return None
    return {"limit": int(limit), "period": float(fields.get(f"{name}_period", "").strip())}


async def _form(request: Request) -> list[tuple[str, str]]:
    """A posted form's fields (application/x-www-form-urlencoded, as browsers send it), read once the
    caller is admitted (the router's role checks run first) and refused past FORM_MAX_BYTES or
    FORM_MAX_FIELDS, before it is parsed."""
    body = await read_body(request, FORM_MAX_BYTES, "the form")
    try:
        return parse_qsl(
            body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=FORM_MAX_FIELDS
        )
    except ValueError:  # counted before parsing
        raise PayloadTooLarge(f"the form has more than {FORM_MAX_FIELDS} fields") from None


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
    fields = await _form(request)
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


@buttons.post("/queues/{queue}/settings", response_model=None)
async def configure_queue(
    queue: QueuePath, request: Request, runtime: RuntimeDep, caller: Caller, next: Next = "/ui"
) -> Response:
    """The queue page's settings form: a field left empty keeps its setting (Jobs per key at once: no
    limit); a number the API would refuse is refused with its reason."""
    caller.admit(queue)
    fields = dict(await _form(request))
    try:
        current = (await service.queue(runtime.db, queue))["settings"]
    except NotFound:  # saving creates it, as PATCH /queues/{queue} does
        current = {}
    patch: dict[str, object] = {}
    try:
        for name, _, _ in pages.SETTINGS:
            text = fields.get(name, "").strip()
            if text:
                patch[name] = int(text) if name == "max_attempts" else float(text)
        concurrency_text = fields.get("key_concurrency", "").strip()
        concurrency = int(concurrency_text) if concurrency_text else None
        rates = {name: _rate(fields, name) for name in ("rate", "key_rate")}
    except ValueError:
        return back(next, "Settings not saved: each must be a number (attempts, per key and leases: whole).")
    if concurrency != current.get("key_concurrency"):
        patch["key_concurrency"] = concurrency
    for name, rate in rates.items():
        if rate != current.get(name):
            patch[name] = rate
    fair = fields.get("fair") == "on"
    if fair != bool(current.get("fair")):
        patch["fair"] = fair
    try:
        settings = QueueSettingsPatch.model_validate(patch)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return back(next, f"Settings not saved: {reasons}.")
    await service.configure_queue(runtime, queue, settings)
    return back(next, f"Saved the settings of {queue}.")


@buttons.post("/schedules/{name}/pause", response_model=None)
async def pause_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    done = f"Paused schedule {name}: it enqueues nothing until resumed."
    return await _pressed(next, schedules.set_paused(db, name, True, caller.like), done)


@buttons.post("/schedules/{name}/resume", response_model=None)
async def resume_schedule(
    name: SchedulePath, db: DB, caller: Caller, next: Next = "/ui/schedules"
) -> Response:
    done = f"Resumed schedule {name}."
    return await _pressed(next, schedules.set_paused(db, name, False, caller.like), done)


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


router.include_router(viewed)
router.include_router(buttons)
