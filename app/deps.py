"""Request dependencies: the process's Database and Wakeups, set up by the lifespan in app.main."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel

from app.db import Database
from app.problems import PROBLEM_JSON
from app.wakeups import Wakeups


# Dependencies are coroutines: FastAPI would run plain functions in a thread pool, on every request.
async def _database(request: Request) -> Database:
    return request.app.state.db


async def _wakeups(request: Request) -> Wakeups:
    return request.app.state.wakeups


DB = Annotated[Database, Depends(_database)]
WakeupsDep = Annotated[Wakeups, Depends(_wakeups)]


class Problem(BaseModel):
    """RFC 9457 problem details; `code` is the stable machine-readable word."""

    type: str
    title: str
    status: int
    detail: str
    code: str


def answers(
    model: type[BaseModel] | Any, *problem_statuses: int, status: int = 200, auth: bool = True
) -> dict[int | str, Any]:
    """OpenAPI `responses` for a route: its answer's model, and the problems it may give.

    Routes declare `response_model=None` and return plain dicts, encoded once by app.web.JSONBody, so
    the model documents the answer without being run on every response."""
    return {status: {"model": model}} | problems(*problem_statuses, *((401, 403) if auth else ()))


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the problem answers a route may give (422 and 503 always)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in (*statuses, 422, 503):
        out[status] = {"model": Problem, "content": {PROBLEM_JSON: {}}}
    return out
