"""The role checks of the routes: FastAPI dependencies applying the rules of app/core/access.py (tokens,
roles, queue patterns) to a request's `Authorization` header."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from app.core.access import Admits, Grant, Role

# Declares the scheme in the OpenAPI document; the check itself is below.
bearer = HTTPBearer(
    auto_error=False,
    description="A token configured with one or more roles (producer, worker, viewer, admin), "
    "optionally limited to some queues.",
)


GRANT = "jobq.grant"  # where the role check leaves the caller's Grant, in the request's ASGI scope


def allow(*roles: Role):
    """A dependency admitting callers holding one of `roles` (admins always). The check carries its
    ``Admits`` as `admits`, for routes answered without FastAPI's dependencies (app/http/fastpath/hot.py)."""
    admits = Admits(*roles)

    async def check(request: Request, _: object = Depends(bearer)) -> None:
        request.scope[GRANT] = admits.check(
            request.app.state.tokens, request.headers.get("authorization", "")
        )

    check.admits = admits  # type: ignore[attr-defined]
    return Depends(check)


async def _caller(request: Request) -> Grant:
    grant = request.scope.get(GRANT)
    if grant is None:
        # Route dependencies run before the endpoint's own, so a route with a role check always has
        # its caller here; tests/http/test_scopes.py holds every route to a role decision.
        raise RuntimeError(f"{request.url.path} asks for its caller but has no role check")
    return grant


# The caller's Grant, for an endpoint that checks queues. Hot routes (app/http/fastpath/hot.py) get the same
# Grant from the same role check, as the argument `caller`.
Caller = Annotated[Grant, Depends(_caller)]

Producer = allow(Role.PRODUCER)
Worker = allow(Role.WORKER)
Viewer = allow(Role.VIEWER)
Reader = allow(Role.PRODUCER, Role.WORKER, Role.VIEWER)  # every role reads jobs
QueueReader = allow(Role.WORKER, Role.VIEWER)  # a worker reads its queue's settings (the lease length)
AnyRole = allow(*Role)
Admin = allow()
