"""Request dependencies: the process's Database, for the routes that need only the pool, and its Runtime
(app/service/runtime.py), for those that need more; both set up by the lifespan in app.main."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from app.core.states import JobStatus
from app.db.pool import Database
from app.http.problems import PROBLEM_JSON, ProblemCode
from app.http.schemas import Readiness
from app.service.runtime import Runtime


# Dependencies are coroutines: FastAPI would run plain functions in a thread pool, on every request.
async def _database(request: Request) -> Database:
    return request.app.state.db


async def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


DB = Annotated[Database, Depends(_database)]
RuntimeDep = Annotated[Runtime, Depends(_runtime)]


class FieldError(BaseModel):
    """One thing wrong with a request, in a `validation_error` problem."""

    loc: list[str] = Field(description='Where: "body", "query" or "path", then field names and list indexes.')
    msg: str = Field(description="What is wrong, in words.")
    type: str = Field(description="pydantic's error type, e.g. missing, string_too_long, value_error.")


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every error answer (`application/problem+json`). The
    fields past `code` come only with the codes they name, never as null."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "type": "urn:jobq:problem:lease_lost",
                    "title": "Conflict",
                    "status": 409,
                    "detail": "job 42 is no longer held by this lease token",
                    "code": "lease_lost",
                }
            ]
        }
    )

    type: str = Field(description="`urn:jobq:problem:` and the code.")
    title: str = Field(description="The HTTP status's phrase.")
    status: int = Field(description="The HTTP status, as in the answer's status line.")
    detail: str = Field(description="What went wrong and what to do about it, for people.")
    code: ProblemCode = Field(
        description="What went wrong, for programs. Open to additions: a later release may add codes"
        " (never rename or drop one), so read an unknown code by the answer's status."
    )
    errors: list[FieldError] | SkipJsonSchema[None] = Field(
        default=None, description="With `validation_error` from request checks: each thing wrong."
    )
    nothing_done: bool | SkipJsonSchema[None] = Field(
        default=None,
        description="With `unavailable`: true when the request certainly changed nothing, so it is safe to"
        " send again even where that is not idempotent.",
    )
    job_status: JobStatus | SkipJsonSchema[None] = Field(
        default=None, description="With `conflict` about a job's state: the status it is in."
    )
    host: str | SkipJsonSchema[None] = Field(
        default=None, description="With `disallowed_host`: the host refused."
    )


class Unready(Problem, Readiness):
    """GET /readyz's 503: an `unavailable` problem, saying why in `detail`, with the readiness fields
    beside it."""

    ready: Literal[False] = Field(description="Always false here.")


def answers(
    model: type[BaseModel] | Any,
    *problem_statuses: int,
    status: int = 200,
    auth: bool = True,
) -> dict[int | str, Any]:
    """OpenAPI `responses` for a route: its answer's model, and the problems it may give: those named,
    401 and 403 when it checks roles, 422 and 503 (app/http/openapi.py drops the 422 of a route that takes no
    input).

    Routes declare `response_model=None` and return plain dicts, encoded once by app.http.web.JSONBody, so
    the model documents the answer without being run on every response."""
    statuses = (*problem_statuses, *((401, 403) if auth else ()), 422, 503)
    return {status: {"model": model}} | problems(*statuses)


def problems(*statuses: int, model: type[Problem] = Problem) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the problem answers a route may give: the Problem schema (or a
    problem with more fields) under `application/problem+json` alone (app/http/openapi.py moves it there from
    FastAPI's `application/json`)."""
    return {status: {"model": model, "content": {PROBLEM_JSON: {}}} for status in statuses}
