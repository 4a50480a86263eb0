"""What every dashboard route shares: who is calling (a token, or a session cookie's) and the role check,
the path and query types, the HTML answer with its headers, and the redirect back to a button's page.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from app.core.access import Admits, Role
from app.core.errors import JobqError, PayloadTooLarge, Unauthorized
from app.core.limits import MAX_JOB_ID, MAX_QUEUE_NAME, QUEUE_NAME_PATTERN
from app.http.auth import GRANT, Caller
from app.http.fastpath.limited import read_body
from app.ui import pages
from app.ui.session import COOKIE, PATH

QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]
# Schedule names have the queue names' rules (docs of PUT /schedules/{name}).
SchedulePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
Flash = Annotated[str | None, Query(max_length=500)]
Next = Annotated[str, Query(max_length=2000)]

# A posted form's limits: a selection of SELECTED_AT_MOST jobs (app/ui/routes/jobs.py) is 500 `id` fields
# of at most 20 bytes.
FORM_MAX_BYTES = 64 * 1024
FORM_MAX_FIELDS = 1000


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
        headers["Set-Cookie"] = cleared_cookie(request)
    return HTTPException(303, "sign in first", headers=headers)


def cleared_cookie(request: Request) -> str:
    gone = Response()
    gone.delete_cookie(
        COOKIE, path=PATH, secure=request.url.scheme == "https", httponly=True, samesite="strict"
    )
    return gone.headers["set-cookie"]


def page_router() -> APIRouter:
    """A router of pages: for viewers and admins."""
    return APIRouter(prefix="/ui", dependencies=[dashboard(Role.VIEWER)])


def button_router() -> APIRouter:
    """A router of buttons: admins' only (a viewer's pages show no button); their cross-site posts are
    refused by app/http/middleware/origin.py."""
    return APIRouter(prefix="/ui", dependencies=[dashboard()])


# --- what pages and buttons share ------------------------------------------------------------------


def seen_queues(request: Request, caller: Caller, *also: str | None) -> list[str]:
    """The queues a picker lists: those the metrics last saw (refreshed every few seconds, not a fresh
    scan) that the caller may see, and `also`."""
    seen = {row["queue"] for row in request.app.state.metrics.gauges.queues}
    return sorted({name for name in seen if caller.admits(name)} | {name for name in also if name})


async def pressed(next: str, action: Awaitable[object], done: str) -> RedirectResponse:
    """A button's answer: back to its page with `done` once `action` has run, or with why it was refused
    (a job in another state, a schedule that does not exist)."""
    try:
        await action
    except JobqError as exc:
        return back(next, exc.detail)
    return back(next, done)


async def read_form(request: Request) -> list[tuple[str, str]]:
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
