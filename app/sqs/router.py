"""``POST /`` answering ``X-Amz-Target: AmazonSQS.<Action>``: parse, authenticate, dispatch, answer.

Not in the OpenAPI document: SQS clients work from AWS's own service model.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import APIRouter, Request, Response

from app.access import OPEN
from app.errors import DATABASE_UNAVAILABLE, Invalid, JobqError, PayloadTooLarge, Unavailable
from app.sqs import auth
from app.sqs.actions import ACTIONS
from app.sqs.context import Context
from app.sqs.protocol import SqsError, json_answer
from app.web import disconnected

log = logging.getLogger("jobq.sqs")

router = APIRouter()
PREFIX = "AmazonSQS."


@router.post("/", include_in_schema=False)
async def sqs(request: Request) -> Response:
    try:
        return json_answer(await _dispatch(request))
    except SqsError as error:
        return error.response()
    except PayloadTooLarge as exc:
        return SqsError("InvalidParameterValue", exc.detail).response()
    except Invalid as exc:
        return SqsError("InvalidParameterValue", str(exc).splitlines()[0]).response()
    except Unavailable as exc:  # e.g. too many long-polls waiting (JOBQ_MAX_WAITERS): SDKs retry it
        return SqsError("ServiceUnavailable", exc.detail, 503).response()
    except JobqError as exc:
        return SqsError("InvalidParameterValue", exc.detail, status=exc.status).response()
    except DATABASE_UNAVAILABLE:
        return SqsError("ServiceUnavailable", "The database is unreachable; retry shortly.", 503).response()


async def _dispatch(request: Request) -> dict:
    target = request.headers.get("x-amz-target", "")
    if not target.startswith(PREFIX):
        raise SqsError("UnknownOperationException", "Send X-Amz-Target: AmazonSQS.<Action>.")
    action = ACTIONS.get(target[len(PREFIX) :])
    if action is None:
        raise SqsError("UnknownOperationException", f"jobq does not implement {target}.")
    raw = await request.body()
    grant = await auth.check(request, raw, target[len(PREFIX) :]) or OPEN
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise SqsError("SerializationException", "The request body is not valid JSON.") from exc
    if not isinstance(body, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    auth.admit(grant, body)
    state = request.app.state
    if not hasattr(state, "sqs_move_tasks"):
        state.sqs_move_tasks = []
    context = Context(
        db=state.db,
        wakeups=state.wakeups,
        base_url=str(request.base_url),
        disconnected=disconnected(request),
        move_tasks=state.sqs_move_tasks,
        grant=grant,
    )
    return await action(context, body)
