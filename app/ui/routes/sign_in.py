"""Signing in to the dashboard and out: a token of a viewer or an admin, entered once, becomes a session
cookie (app/ui/session.py); signing out clears it. These routes need no token.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.core.access import Role
from app.ui import pages
from app.ui.routes.common import Flash, Next, cleared_cookie, html, read_form, within
from app.ui.session import COOKIE, PATH

router = APIRouter()


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
    fields = dict(await read_form(request))
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
    response.headers["Set-Cookie"] = cleared_cookie(request)
    return response
