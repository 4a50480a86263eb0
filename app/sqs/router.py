"""``POST /``: SQS's API in both of its wire formats, told apart per request as SQS does: a form body
(``Action=...``) is the Query protocol (app/sqs/query.py), ``X-Amz-Target: AmazonSQS.<Action>`` with a
JSON body the JSON 1.0 protocol (app/sqs/protocol.py). Parse, authenticate, dispatch, answer in kind.

Query requests may also go to a queue's URL (``POST /000000000000/orders``), as the AWS SDK for Java 1.x
sends them, with the queue taken from the URL when the request does not name one.

Not in the OpenAPI document: SQS clients work from AWS's own service model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from app.access import OPEN, Grant
from app.errors import (
    DATABASE_REJECTED_INPUT,
    DATABASE_UNAVAILABLE,
    Invalid,
    JobqError,
    PayloadTooLarge,
    Unavailable,
)
from app.sqs import auth, query
from app.sqs.actions import ACTIONS
from app.sqs.context import Context
from app.sqs.protocol import ACCOUNT, SqsError, json_answer
from app.web import disconnected

log = logging.getLogger("jobq.sqs")

router = APIRouter()
PREFIX = "AmazonSQS."


@router.post("/", include_in_schema=False)
async def sqs(request: Request) -> Response:
    return await _serve(request, queue_url=None)


@router.post("/{account:int}/{queue}", include_in_schema=False)
async def sqs_at_queue_url(request: Request, account: int, queue: str) -> Response:
    """A Query request sent to the queue's URL, which names the queue (the path's account is jobq's)."""
    return await _serve(request, queue_url=f"{str(request.base_url).rstrip('/')}/{ACCOUNT}/{queue}")


async def _serve(request: Request, queue_url: str | None) -> Response:
    is_query = request.headers.get("content-type", "").startswith(query.FORM)
    error: Callable[[SqsError], Response] = query.error if is_query else SqsError.response
    try:
        raw = await request.body()
        try:
            if is_query:
                params = query.parse_form(raw, request.query_params.multi_items())
                name = _query_action(params)
            else:
                name = _json_action(request)
        except SqsError:
            await auth.check(request, raw, None)  # a bad signature is the first thing to hear of
            raise
        # The signature and the key's roles first: an unsigned request learns nothing of its body.
        grant = await auth.check(request, raw, name) or OPEN
        body = query.decode(query.ACTIONS[name][0], params) if is_query else _json_body(raw)
        if queue_url is not None:
            body.setdefault("QueueUrl", queue_url)
        auth.admit(grant, body)
        answer = await ACTIONS[name](_context(request, grant), body)
        return query.answer(name, answer) if is_query else json_answer(answer)
    except SqsError as exc:
        return error(exc)
    except PayloadTooLarge as exc:
        return error(SqsError("InvalidParameterValue", exc.detail))
    except Invalid as exc:
        return error(SqsError("InvalidParameterValue", str(exc).splitlines()[0]))
    except Unavailable as exc:  # e.g. too many long-polls waiting (JOBQ_MAX_WAITERS): SDKs retry it
        return error(SqsError("ServiceUnavailable", exc.detail, 503))
    except JobqError as exc:
        return error(SqsError("InvalidParameterValue", exc.detail, status=exc.status))
    except DATABASE_UNAVAILABLE:
        return error(SqsError("ServiceUnavailable", "The database is unreachable; retry shortly.", 503))
    except DATABASE_REJECTED_INPUT as exc:  # a value no check above caught, refused by PostgreSQL
        return error(SqsError("InvalidParameterValue", f"A value was refused: {str(exc).splitlines()[0]}"))
    except Exception:  # a fault of jobq's: logged, and answered in the client's own wire format
        log.exception("SQS request failed")
        return error(SqsError("InternalFailure", "The request failed on the server; see its log.", 500))


def _json_action(request: Request) -> str:
    """The action ``X-Amz-Target`` names."""
    target = request.headers.get("x-amz-target", "")
    if not target.startswith(PREFIX):
        raise SqsError("UnknownOperationException", "Send X-Amz-Target: AmazonSQS.<Action>.")
    name = target[len(PREFIX) :]
    if name not in ACTIONS:
        raise SqsError("UnknownOperationException", f"jobq does not implement {target}.")
    return name


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise SqsError("SerializationException", "The request body is not valid JSON.") from exc
    if not isinstance(body, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return body


def _query_action(params: list[tuple[str, str]]) -> str:
    """The action a Query request's ``Action`` parameter names."""
    name = next((value for key, value in params if key == "Action"), None)
    if not name:
        raise SqsError("MissingAction", "The request must contain the parameter Action.")
    if name not in ACTIONS or name not in query.ACTIONS:
        raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
    return name


def _context(request: Request, grant: Grant) -> Context:
    state = request.app.state
    if not hasattr(state, "sqs_move_tasks"):
        state.sqs_move_tasks = []
    return Context(
        db=state.db,
        wakeups=state.wakeups,
        base_url=str(request.base_url),
        disconnected=disconnected(request),
        move_tasks=state.sqs_move_tasks,
        grant=grant,
        trace_header=request.headers.get("x-amzn-trace-id"),
    )
