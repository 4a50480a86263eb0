"""The dispatcher of the hot routes: the POSTs of workers and producers, answered without FastAPI's
per-request machinery.

`/lease`, `/ack`, `/jobs` and their kin carry nearly all of a busy queue's requests, and most of each is
small. FastAPI serves a request by matching it against every route, wrapping it in a Request, solving the
route's dependencies one by one and validating a body that Python's json module has parsed first: about
half of the service's CPU time on a one-job lease or ack. ``HotRoutes`` dispatches these routes itself,
and adds no rule of its own: each step of a request has one home, which both ways in use.

- The body's shape and limits: the route's pydantic model (app/http/schemas/), taken from the endpoint's
  signature. The JSON text is read by app/core/jsontext.py ``read_json`` both here and on FastAPI's way
  (app/http/fastpath/route.py ``StrictJSONRequest``): numbers kept as sent, NaN and Infinity refused,
  and nesting past `max_json_depth` refused before parsing (``nesting_depth``).
  The bodies sent in bulk (enqueues, acks, releases) are read by app/http/fastpath/bodies.py first, which
  refuses more than the model and reads alike what it accepts; what it refuses goes on to the model.
- The caller's role: ``Admits.check`` (app/core/access.py), taken from the route's own role dependency, and
  checked before the body is read, as on FastAPI's way (app/http/fastpath/route.py ``JobqRoute``).
- The queues the body names: the endpoint itself (``caller.admit``), with the Grant the role check gave.
- The answer: the endpoint's, byte for byte; an error becomes its problem body in app/http/problems.py.

Only the ordinary case is taken this way. A query string, a content type other than `application/json`,
a body nested too deeply or that the parser or the model refuses: these go on to FastAPI as if nothing had
happened (the body already read is handed on), so every refusal is worded in one place, FastAPI's
(tests/http/test_fastpath_hot.py sends each request both ways and compares).

A route of the routers given is hot when it is a ``POST`` to a fixed path (no path parameters), every
dependency of it is a role check, and its endpoint takes nothing but `body` (a pydantic model), `db`,
`runtime`, `request` and `caller`; a route added later is hot or not by the same rule.

One read is hot too: ``GET /jobs/{id}``, with no query string or only `wait` (a plain number up to 60).
A wait for a job holds its request while the job runs, thousands of them at once in a request-reply
service, and FastAPI's machinery kept per waiting request (its exit stacks, dependency state, middleware
frames) was four fifths of what each cost in memory.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec
from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.access import OPEN, Admits, Grant
from app.core.jsontext import read_json
from app.core.limits import MAX_JOB_ID
from app.http import problems
from app.http.fastpath import bodies as fast_bodies
from app.http.web import nesting_depth

ARGUMENTS = {"body", "db", "runtime", "request", "caller"}

# The hot read, `GET /jobs/{id}[?wait=N]`, in the ordinary spelling; anything else goes to FastAPI.
JOB_READ = "/jobs/{id}"
_JOB_PATH = re.compile(r"/jobs/([1-9][0-9]{0,18})")
_WAIT_QUERY = re.compile(rb"(?:wait=([0-9]{1,2}(?:\.[0-9]{1,6})?))?")


@dataclass(frozen=True, slots=True)
class Hot:
    route: APIRoute
    model: type[BaseModel]
    fast: msgspec.json.Decoder | None  # the model's fast reader (app/http/fastpath/bodies.py), if it has one
    admits: tuple[Admits, ...]
    endpoint: Callable[..., Awaitable[Any]]
    wants: frozenset[str]  # which of ARGUMENTS the endpoint takes


def hot_routes(routers: Sequence[APIRouter]) -> dict[str, Hot]:
    """The hot routes of `routers`, by path (see the module's docstring for the rule)."""
    table = {}
    for route in (route for router in routers for route in router.routes):
        if not isinstance(route, APIRoute) or route.methods != {"POST"} or route.param_convertors:
            continue
        checks = [getattr(d.dependency, "admits", None) for d in route.dependencies]
        wants = set(inspect.signature(route.endpoint).parameters)
        model = get_type_hints(route.endpoint).get("body")
        if None in checks or not wants <= ARGUMENTS or not isinstance(model, type):
            continue
        if not issubclass(model, BaseModel):
            continue
        fast = fast_bodies.reader(model)
        table[route.path] = Hot(route, model, fast, tuple(checks), route.endpoint, frozenset(wants))
    return table


def _headers(scope: Scope) -> tuple[bytes | None, bytes]:
    """The request's Content-Type and Authorization (the first of each, as Starlette reads them), in one
    pass over its headers."""
    content_type, authorization = None, None
    for name, value in scope["headers"]:
        if name == b"content-type":
            if content_type is None:
                content_type = value
        elif name == b"authorization" and authorization is None:
            authorization = value
    return content_type, authorization or b""


def _is_json(content_type: bytes | None) -> bool:
    return content_type is not None and content_type.split(b";", 1)[0].strip().lower() == b"application/json"


async def _read_body(receive: Receive) -> bytes:
    """The whole request body, read as Starlette's ``Request.body`` reads it but without its async
    generator. That generator and the Request's header and state lookups (``_headers`` and ``state``
    below instead) were a quarter of the app's own CPU time on a one-job lease, measured in-process."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


def _job_read_route(routers: Sequence[APIRouter]) -> tuple[APIRoute, tuple[Admits, ...]]:
    for route in (route for router in routers for route in router.routes):
        if isinstance(route, APIRoute) and route.path == JOB_READ and route.methods == {"GET"}:
            return route, tuple(d.dependency.admits for d in route.dependencies)  # type: ignore[attr-defined]
    raise LookupError(f"no GET {JOB_READ} among the routers")


def _job_read(scope: Scope) -> tuple[int, float] | None:
    """The job id and wait of an ordinary `GET /jobs/{id}[?wait=N]`; None for anything else."""
    path = _JOB_PATH.fullmatch(scope["path"])
    query = _WAIT_QUERY.fullmatch(scope["query_string"])
    if path is None or query is None:
        return None
    job_id, wait = int(path[1]), float(query[1] or 0)
    return (job_id, wait) if job_id <= MAX_JOB_ID and wait <= 60 else None


class HotRoutes:
    def __init__(self, app: ASGIApp, routers: Sequence[APIRouter]) -> None:
        self.app = app
        self.routes = hot_routes(routers)
        self.job_read, self.job_read_admits = _job_read_route(routers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            return await self._read_job(scope, receive, send)
        hot = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if hot is None or scope["method"] != "POST" or scope["query_string"]:
            return await self.app(scope, receive, send)
        content_type, authorization = _headers(scope)
        if not _is_json(content_type):
            return await self.app(scope, receive, send)
        scope["route"], scope["endpoint"], scope["path_params"] = hot.route, hot.endpoint, {}
        request = Request(scope, receive)
        state = scope["app"].state
        try:
            # The caller first: a stranger's body is neither read nor parsed.
            grant = _grant(hot.admits, state, authorization)
            request._body = body = await _read_body(receive)  # as Request.body() would keep it
            body_model = _parse(hot, body, state.settings.max_json_depth)
            if body_model is None:
                response = None
            else:
                response = await _call(hot, body_model, request, state, grant)
        except ClientDisconnect:
            return  # gone before its body arrived: nobody to answer
        except Exception as exc:
            response = await problems.answer(request, exc)
        if response is None:  # not the ordinary case: FastAPI answers, from the same body
            return await self.app(scope, _replay(body, receive), send)
        await response(scope, receive, send)

    async def _read_job(self, scope: Scope, receive: Receive, send: Send) -> None:
        read = _job_read(scope)
        if read is None:
            return await self.app(scope, receive, send)
        route = self.job_read
        scope["route"], scope["endpoint"] = route, route.endpoint
        scope["path_params"] = {"id": str(read[0])}
        request = Request(scope, receive)
        state = scope["app"].state
        try:
            grant = _grant(self.job_read_admits, state, _headers(scope)[1])
            response = await route.endpoint(
                id=read[0], wait=read[1], runtime=state.runtime, caller=grant, request=request
            )
        except Exception as exc:
            response = await problems.answer(request, exc)
        await response(scope, receive, send)


async def _call(hot: Hot, body: BaseModel, request: Request, state: Any, grant: Grant) -> Response:
    """The endpoint's answer, for a caller whose role is checked. The endpoint gets the caller's Grant
    as `caller`, as FastAPI would give it (app/http/auth.py ``Caller``), and checks the queues the body names
    with it: one check for both ways in."""
    arguments = {"body": body, "db": state.db, "runtime": state.runtime, "request": request, "caller": grant}
    return await hot.endpoint(**{name: arguments[name] for name in hot.wants})


def _grant(checks: tuple[Admits, ...], state: Any, authorization: bytes) -> Grant:
    """The caller's Grant from the route's role checks (app/core/access.py), as FastAPI's dependency
    gives it."""
    grant = OPEN
    for admits in checks:
        grant = admits.check(state.tokens, authorization.decode("latin-1"))
    return grant


def _parse(hot: Hot, body: bytes, depth_limit: int) -> Any:
    """The body as the route's model (or its fast reader's struct); None when anything about it is out of
    the ordinary."""
    if nesting_depth(body, depth_limit) > depth_limit:
        return None
    if hot.fast is not None and (read := fast_bodies.read(hot.fast, body)) is not None:
        return read
    try:
        # The parser of FastAPI's way too (app/http/web.py): every number kept as sent.
        return hot.model.model_validate(read_json(body))
    except ValueError:  # the parser's and the model's refusals both
        return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body, already read, handed out once more first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
