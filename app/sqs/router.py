"""``POST /``: SQS's API in both of its wire formats, told apart per request as SQS does: a form body
(``Action=...``) is the Query protocol (app/sqs/query.py), ``X-Amz-Target: AmazonSQS.<Action>`` with a
JSON body the JSON 1.0 protocol (app/sqs/protocol.py). Authenticate, parse, dispatch, answer in kind.

``GET /?Action=...`` is the Query protocol too, its parameters in the URL, as SQS serves it: every GET is
a Query request (the JSON protocol is POST only), signed in its Authorization header or in its URL
(a presigned URL: app/sqs/auth.py). A Query request that sends ``Accept: application/json`` is answered
in JSON, the body a JSON 1.0 request gets, and so are its errors (``query.wants_json``).

A GET acts as a POST does (SendMessage, DeleteQueue), so it is judged as app/http/middleware/origin.py
judges every POST before it gets here: one a page of another site made a browser send is refused
(``_refuse_cross_site``). The middleware itself lets GETs through, as reads.

A request's credentials are checked as far as its headers allow before its body is read (app/sqs/auth.py),
and the body is read up to MAX_REQUEST_BYTES only and counted before it is parsed (a form's fields, JSON's
values; query.MAX_FIELDS), large ones in a thread: a stranger's 16 MB body costs the service nothing, and
no body stalls the requests beside it.

Query requests may also go to a queue's URL (``POST /000000000000/orders``, or GET), as the AWS SDK for Java
1.x sends them, with the queue taken from the URL when the request does not name one.

Not in the OpenAPI document: SQS clients work from AWS's own service model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from app.core.access import OPEN, Grant
from app.core.errors import (
    DATABASE_REJECTED_INPUT,
    DATABASE_UNAVAILABLE,
    Invalid,
    JobqError,
    PayloadTooLarge,
    Unavailable,
)
from app.http.fastpath.limited import read_body
from app.http.middleware.origin import HEADERS, cross_origin
from app.http.problems import status_of
from app.http.web import disconnected, json_values
from app.sqs import auth, query
from app.sqs.actions import ACTIONS
from app.sqs.attributes import MAX_MESSAGE_BYTES
from app.sqs.context import Context
from app.sqs.protocol import ACCOUNT, SqsError, json_answer
from app.sqs.regions import Regions, arn_parts, url_parts

log = logging.getLogger("jobq.sqs")
T = TypeVar("T")

# The largest body of any SQS request: a message of MAX_MESSAGE_BYTES (1 MiB, body and attributes, also
# a batch's messages together) takes at most 4 MiB in a form (a binary attribute: base64, 4/3 of its
# bytes, each of them percent-encoded, 3 bytes), at most 3 MiB in JSON (\uXXXX for a 2-byte character),
# plus the parameter names, ids and URL around them (well under 64 KiB). A larger body is refused before
# it is read.
MAX_REQUEST_BYTES = 4 * MAX_MESSAGE_BYTES + 64 * 1024
# Bodies up to this many bytes are parsed on the event loop (a few milliseconds at worst); larger ones are
# parsed in a thread (a form) or counted first (JSON).
PARSED_ON_THE_LOOP = 64 * 1024

router = APIRouter()
PREFIX = "AmazonSQS."


@router.api_route("/", methods=["GET", "POST"], include_in_schema=False)
async def sqs(request: Request) -> Response:
    return await _serve(request, queue_url=None)


@router.api_route("/{account:int}/{queue}", methods=["GET", "POST"], include_in_schema=False)
async def sqs_at_queue_url(request: Request, account: int, queue: str) -> Response:
    """A Query request sent to the queue's URL, which names the queue (the path's account is jobq's)."""
    return await _serve(request, queue_url=f"{str(request.base_url).rstrip('/')}/{ACCOUNT}/{queue}")


@router.api_route("/queue/{region}/{account:int}/{queue}", methods=["GET", "POST"], include_in_schema=False)
async def sqs_at_regional_queue_url(request: Request, region: str, account: int, queue: str) -> Response:
    """The same, at the URL of a queue of a region other than the default one (app/sqs/regions.py)."""
    base = str(request.base_url).rstrip("/")
    return await _serve(request, queue_url=f"{base}/queue/{region}/{ACCOUNT}/{queue}")


async def _serve(request: Request, queue_url: str | None) -> Response:
    is_get = request.method == "GET"
    is_query = is_get or request.headers.get("content-type", "").startswith(query.FORM)
    in_json = not is_query or query.wants_json(request.headers.get("accept", ""))
    error: Callable[[SqsError], Response] = SqsError.response if in_json else query.error
    try:
        if is_get:
            _refuse_cross_site(request)
        # What the headers decide of the credentials first: a stranger's body is not even read.
        signed = auth.before_body(request)
        raw = await _read(request)
        # Then the signature, which covers the body; then the action and the key's roles. An unsigned
        # request learns nothing of its body, a bad signature is the first thing to hear of.
        grant = await auth.verify(request, signed, raw) or OPEN
        if is_query:
            params = await _off_the_loop(raw, query.parse_form, raw, request.query_params.multi_items())
            name = _query_action(params)
        else:
            name = _json_action(request)
        auth.permit(grant, name)
        body = query.request_body(name, params) if is_query else _json_body(raw)
        if queue_url is not None:
            body.setdefault("QueueUrl", queue_url)
        ctx = _context(request, grant, auth.signing_region(request, signed), body)
        auth.admit(ctx, body)
        answer = await ACTIONS[name](ctx, body)
        return json_answer(answer) if in_json else query.answer(name, answer)
    except ClientDisconnect:
        return Response(status_code=400)  # gone before its body came: nobody to answer
    except SqsError as exc:
        return error(exc)
    except PayloadTooLarge as exc:
        return error(SqsError("InvalidParameterValue", exc.detail))
    except Invalid as exc:
        return error(SqsError("InvalidParameterValue", str(exc).splitlines()[0]))
    except Unavailable as exc:  # e.g. too many long-polls waiting (JOBQ_MAX_WAITERS): SDKs retry it
        return error(SqsError("ServiceUnavailable", exc.detail, 503))
    except JobqError as exc:
        return error(SqsError("InvalidParameterValue", exc.detail, status=status_of(exc)))
    except DATABASE_UNAVAILABLE:
        return error(SqsError("ServiceUnavailable", "The database is unreachable; retry shortly.", 503))
    except DATABASE_REJECTED_INPUT as exc:  # a value no check above caught, refused by PostgreSQL
        return error(SqsError("InvalidParameterValue", f"A value was refused: {str(exc).splitlines()[0]}"))
    except Exception:  # a fault of jobq's: logged, and answered in the client's own wire format
        log.exception("SQS request failed")
        return error(SqsError("InternalFailure", "The request failed on the server; see its log.", 500))


def _refuse_cross_site(request: Request) -> None:
    """AccessDenied for a GET a page of another site made a browser send: an image or a link there could
    otherwise send messages or delete queues of a service that takes unsigned requests. The rule is the
    one app/http/middleware/origin.py applies to every POST (``cross_origin``, trusted origins included),
    so a GET is refused exactly when the same request as a POST would be. Only the answer differs: an
    SQS error in the request's own format, where the middleware answers a problem document."""
    headers: dict[bytes, bytes] = {}
    for name, value in request.scope["headers"]:
        if name in HEADERS:
            headers.setdefault(name, value)  # of a repeated header, the first, as the middleware reads it
    trusted = frozenset(origin.encode("latin-1") for origin in request.app.state.settings.trusted_origins)
    reason = cross_origin(headers, trusted)
    if reason is not None:
        raise SqsError(
            "AccessDenied",
            f"Cross-origin request refused ({reason}): a page of another site made the browser send it."
            " Call SQS from a server or a script, or list the page's origin in JOBQ_TRUSTED_ORIGINS.",
            403,
        )


def _json_action(request: Request) -> str:
    """The action ``X-Amz-Target`` names."""
    target = request.headers.get("x-amz-target", "")
    if not target.startswith(PREFIX):
        raise SqsError("UnknownOperationException", "Send X-Amz-Target: AmazonSQS.<Action>.")
    name = target[len(PREFIX) :]
    if name not in ACTIONS:
        raise SqsError("UnknownOperationException", f"jobq does not implement {target}.")
    return name


async def _read(request: Request) -> bytes:
    """The request's body, refused past MAX_REQUEST_BYTES before any more of it is read."""
    try:
        return await read_body(request, MAX_REQUEST_BYTES)
    except PayloadTooLarge as exc:
        raise SqsError("RequestEntityTooLarge", f"{exc.detail}: no SQS request is larger.", 413) from None


async def _off_the_loop(raw: bytes, parse: Callable[..., T], *args: Any) -> T:
    """``parse(*args)``, in a thread when `raw` is large: other requests go on meanwhile."""
    if len(raw) > PARSED_ON_THE_LOOP:
        return await asyncio.to_thread(parse, *args)
    return parse(*args)


def _json_body(raw: bytes) -> dict[str, Any]:
    """The JSON protocol's body. Its values are counted first, at C speed: what a parser costs grows with
    them, and no SQS request holds more than query.MAX_FIELDS."""
    if len(raw) > PARSED_ON_THE_LOOP and json_values(raw) > query.MAX_FIELDS:
        raise SqsError(
            "SerializationException", f"The request body holds more than {query.MAX_FIELDS} JSON values."
        )
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


def _context(request: Request, grant: Grant, signed_for: str | None, body: dict[str, Any]) -> Context:
    """What the action is given: among it the region the request acts in (app/sqs/regions.py), the one it
    is signed for, else the one the queue URL or source ARN it names says."""
    state = request.app.state
    if not hasattr(state, "sqs_move_tasks"):
        state.sqs_move_tasks = []
    if not hasattr(state, "sqs_regions"):
        state.sqs_regions = Regions(tuple(state.settings.aws_regions), strict=auth.checks_signatures(state))
    regions: Regions = state.sqs_regions
    return Context(
        runtime=state.runtime,
        base_url=str(request.base_url),
        disconnected=disconnected(request),
        move_tasks=state.sqs_move_tasks,
        grant=grant,
        trace_header=request.headers.get("x-amzn-trace-id"),
        regions=regions,
        region=regions.of_request(signed_for, _named_region(body)),
    )


def _named_region(body: dict[str, Any]) -> str | None:
    """The region a request's QueueUrl, else its SourceArn, names (None: neither names one); a malformed
    one is left to the action."""
    try:
        if isinstance(body.get("QueueUrl"), str):
            return url_parts(body["QueueUrl"])[0]
        if isinstance(body.get("SourceArn"), str):
            return arn_parts(body["SourceArn"], "SourceArn")[0]
    except SqsError:
        pass
    return None
