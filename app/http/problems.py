"""The one place errors become HTTP answers: RFC 9457 problem details (``application/problem+json``).

Every error body carries a stable machine-readable ``code``. Nothing a client sends can produce a 500 with
a stack trace: validation, database data errors and encoding errors are 4xx; an unreachable database is
503 ``unavailable``. The errors themselves, and the code of each, are in app/core/errors.py; the status of
each code is here (``STATUSES``), and nowhere else.
"""

from __future__ import annotations

import enum
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import (
    DATABASE_REJECTED_INPUT,
    DATABASE_UNAVAILABLE,
    NOTHING_DONE,
    READ_ONLY,
    TRANSACTION_ROLLED_BACK,
    JobqError,
    Unauthorized,
    Unavailable,
)

log = logging.getLogger("jobq.errors")

PROBLEM_JSON = "application/problem+json"


class ProblemCode(enum.StrEnum):
    """What went wrong, for programs: the `code` of a problem answer or of a batch item's result. Open to
    additions: a later release may add codes (never rename or drop one), so read an unknown code by the
    answer's status."""

    # The OpenAPI document lists these as `ProblemCode`; tests/unit/test_openapi.py checks that every code the
    # service sends is here.

    BAD_REQUEST = "bad_request"
    DISALLOWED_HOST = "disallowed_host"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    LEASE_LOST = "lease_lost"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    VALIDATION_ERROR = "validation_error"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


# The HTTP status of each error's code (app/core/errors.py): the one table every answer of an error reads,
# a problem here (the fast path's too, through `answer`), an SQS error (app/sqs/router.py), a dashboard
# page (app/ui/routes/). tests/unit/test_problems.py holds every error class to a status.
STATUSES: dict[str, int] = {
    ProblemCode.UNAUTHORIZED: 401,
    ProblemCode.FORBIDDEN: 403,
    ProblemCode.NOT_FOUND: 404,
    ProblemCode.CONFLICT: 409,
    ProblemCode.LEASE_LOST: 409,
    ProblemCode.PAYLOAD_TOO_LARGE: 413,
    ProblemCode.VALIDATION_ERROR: 422,
    ProblemCode.INTERNAL: 500,
    ProblemCode.UNAVAILABLE: 503,
}


def status_of(exc: JobqError) -> int:
    """The HTTP status that answers `exc`."""
    return STATUSES[exc.code]


def problem(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    body = {
        "type": f"urn:jobq:problem:{code}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def _validation_detail(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    cleaned = [
        {"loc": [str(part) for part in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    text = "; ".join(f"{'.'.join(e['loc']) or 'body'}: {e['msg']}" for e in cleaned[:10])
    return text or "invalid request", cleaned


async def _jobq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, JobqError)
    response = problem(status_of(exc), exc.code, exc.detail, **exc.extra)
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = 'Bearer realm="jobq"'
    elif isinstance(exc, Unavailable):
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail, errors = _validation_detail(list(exc.errors()))
    return problem(422, "validation_error", _not_json(request, exc) or detail, errors=errors)


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _not_json(request: Request, exc: RequestValidationError) -> str | None:
    """What is wrong with a body that is not JSON at all, in words a sender can act on (None when it is
    JSON, and its fields are what was wrong): where the text stops being JSON, by line and column (not
    the character offset the parser reports as if it were a field), and why; a body nested too deeply
    (app/http/web.py); a body sent as something other than JSON."""
    errors = exc.errors()
    for error in errors:
        if error.get("type") == "json_invalid":
            reason = str(error.get("ctx", {}).get("error", "not JSON"))
            text, at = exc.body, error["loc"][-1]
            if not isinstance(text, str) or not text or not isinstance(at, int):
                return f"the body is not valid JSON: {reason}"
            line = text.count("\n", 0, at) + 1
            column = at - text.rfind("\n", 0, at)
            return f"invalid JSON at line {line}, column {column}: {reason[:1].lower()}{reason[1:]}"
    content_type = request.headers.get("content-type", "")
    if not _is_json_type(content_type) and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        sent = f"this request's is {content_type!r}" if content_type else "this request has none"
        return f"send the body as JSON, with Content-Type: application/json ({sent})"
    return None


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    503: "unavailable",
}


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}"
    response = problem(exc.status_code, code, detail)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable on %s %s: %r", request.method, request.url.path, exc)
    if isinstance(exc, READ_ONLY):
        return _retry_soon(
            "the database takes no writes at the moment (a failover under way?); nothing was done, retry "
            "shortly",
            nothing_done=True,
        )
    done = {"nothing_done": True} if getattr(exc, NOTHING_DONE, False) else {}
    return _retry_soon("the database is unreachable; retry shortly", **done)


async def _transaction_rolled_back(request: Request, exc: Exception) -> JSONResponse:
    log.warning("transaction rolled back on %s %s: %r", request.method, request.url.path, exc)
    return _retry_soon(
        f"the database rolled this request back ({exc}); nothing was done, send it again", nothing_done=True
    )


def _retry_soon(detail: str, **extra: Any) -> JSONResponse:
    """503 unavailable, for a second: what the database could not do now it may do on the next try."""
    response = problem(503, "unavailable", detail, **extra)
    response.headers["Retry-After"] = "1"
    return response


async def _database_rejected_input(request: Request, exc: Exception) -> JSONResponse:
    return problem(422, "validation_error", f"a value was refused: {exc}")


async def _recursion(request: Request, exc: Exception) -> JSONResponse:
    return problem(422, "validation_error", "the JSON body is nested too deeply")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return problem(500, "internal", "an unexpected error occurred; it has been logged")


HANDLERS: dict[type[BaseException], Any] = {
    JobqError: _jobq_error,
    RequestValidationError: _request_validation,
    StarletteHTTPException: _http_exception,
    **dict.fromkeys(DATABASE_UNAVAILABLE, _database_unavailable),
    **dict.fromkeys(TRANSACTION_ROLLED_BACK, _transaction_rolled_back),
    **dict.fromkeys(DATABASE_REJECTED_INPUT, _database_rejected_input),
    RecursionError: _recursion,
    Exception: _unexpected,
}


def install(app: FastAPI) -> None:
    for exc_type, handler in HANDLERS.items():
        app.add_exception_handler(exc_type, handler)


async def answer(request: Request, exc: Exception) -> JSONResponse:
    """The problem answering `exc`, chosen as Starlette chooses among the handlers ``install`` adds: by
    the nearest class in the exception's MRO. For routes answered outside FastAPI's routing
    (app/http/fastpath/hot.py)."""
    for cls in type(exc).__mro__:
        handler = HANDLERS.get(cls)
        if handler is not None:
            return await handler(request, exc)
    raise exc
