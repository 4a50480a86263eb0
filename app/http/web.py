"""How jobq reads and writes HTTP bodies.

- Requests: strict JSON. Python's parser accepts NaN and Infinity, which are not JSON and which
  PostgreSQL's jsonb refuses; they are rejected as malformed JSON (422), and so is nesting deeper than
  `max_json_depth` (measured here), before the parser recurses into it: by the routes' request class,
  app/http/fastpath/route.py. Numbers keep every digit as sent (app/core/jsontext.py ``read_json``).
- Responses: encoded once with orjson, times as RFC 3339 UTC with `Z`. Job payloads come from PostgreSQL
  as JSON text and are spliced into the answer as they are (``JSONText``, app/core/jsontext.py), never
  decoded and encoded again. Handlers return a ``JSONBody`` themselves, which spares FastAPI from
  validating and re-encoding every answer; the OpenAPI document still describes each answer, from the
  models named in the route's ``responses``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.jsontext import WRITE_OPTIONS, written
from app.http.problems import problem

# Bytes of a request's body left unread by its answer that the server may read and discard to keep the
# connection open (256 KiB, as Go's net/http); past them the connection is closed with the answer.
UNREAD_DRAINED = 256 * 1024


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413 before reading them: at once from the
    Content-Length header, or, for a body streamed without one, as soon as it passes the limit. An answer
    given before most of a body was read closes the connection (UNREAD_DRAINED)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared, chunked = 0, False
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                declared = int(value)
                if declared > self.limit:
                    return await self._refuse()(scope, receive, send)
            elif name == b"transfer-encoding":
                chunked = True
        received, finished = 0, not declared and not chunked  # finished: no more body to come

        async def counting_receive() -> Message:
            nonlocal received, finished
            message = await receive()
            received += len(message.get("body", b""))
            finished = finished or not message.get("more_body", False)
            if received > self.limit:
                # An HTTPException passes FastAPI's body reading untouched, to the problem handler.
                raise HTTPException(413, self._detail())
            return message

        if finished or (not chunked and declared <= UNREAD_DRAINED):  # nothing to close for
            return await self.app(scope, counting_receive, send)

        async def closing_send(message: Message) -> None:
            # Answered before the body was read (a stranger, a body over a route's cap): the server would
            # read and discard the rest to keep the connection, up to 16 MB. Past UNREAD_DRAINED bytes it
            # closes the connection instead, as Go's net/http does.
            if message["type"] == "http.response.start" and not finished:
                if chunked or declared - received > UNREAD_DRAINED:
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, counting_receive, closing_send)

    def _detail(self) -> str:
        return f"the request body is over the limit of {self.limit} bytes"

    def _refuse(self) -> Response:
        response = problem(413, "payload_too_large", self._detail())
        response.headers["connection"] = "close"  # rather than read and discard the body
        return response


# Opening brackets become "(", closing ones ")": only how deep they nest matters here (a "[" closed by
# "}" is for the parser to refuse).
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STRINGS = re.compile(rb'"[^"]*"')


def _brackets(body: bytes) -> bytes:
    """The brackets of JSON text outside its strings, in order, as parentheses. A backslash only
    occurs inside strings, in escape pairs: dropping escaped backslashes, then escaped quotes, leaves
    only the quotes that open and close strings; once everything else is gone, strings are easy to
    cut out."""
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_AS_PARENS, _NOT_STRUCTURE)
    # Most strings hold no bracket, and are now "". Two quotes side by side are such a string, or the
    # end of one and the start of the next with nothing between: either way nothing to keep.
    text = text.replace(b'""', b"")
    return _STRINGS.sub(b"", text) if b'"' in text else text


_NOT_SEPARATOR = bytes(b for b in range(256) if b not in b'"[{,')


def json_values(body: bytes) -> int:
    """At least how many values JSON text holds: one, and one more for each comma and opening bracket
    outside its strings (strings cut out as ``_brackets`` cuts them). Parsing costs about as much per
    value as per kilobyte of string, so this, counted at C speed, bounds what parsing a body will cost."""
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_SEPARATOR)
    text = text.replace(b'""', b"")
    return 1 + len(_STRINGS.sub(b"", text) if b'"' in text else text)


def nesting_depth(body: bytes, limit: int) -> int:
    """How deeply arrays and objects nest in JSON text, counted up to just past `limit`.

    Cheap where it matters: a body with fewer brackets than `limit` cannot nest deeper, and is not
    scanned. Otherwise each pass removes the innermost pairs, one level of nesting per pass, at C speed:
    a batch of a thousand small jobs costs a few passes, not a Python loop over its brackets. Once a
    pass removes less than half of what is left (deep nesting, or text that is not JSON), the rest is
    counted bracket by bracket, which stops at `limit`: no body costs more than a few passes and one
    scan."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return 0
    brackets = _brackets(body)
    depth = 0
    while brackets and depth <= limit:
        before = len(brackets)
        brackets = brackets.replace(b"()", b"")
        removed = before - len(brackets)
        depth += removed > 0
        if 2 * removed < before:
            return depth + _depth_by_bracket(brackets, limit - depth)
    return depth


def _depth_by_bracket(brackets: bytes, limit: int) -> int:
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte == 40 else -1  # (
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


class JSONBody(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=WRITE_OPTIONS, default=written)


def disconnected(request: Request) -> Callable[[], Coroutine[Any, Any, None]]:
    """A function that returns once the client of `request` has gone, for a long-poll to race its wait
    against. Call it only after the body has been read: ASGI servers then send nothing but
    ``http.disconnect``, when the connection closes (uvicorn: its receive() blocks until then), so this
    reads no request data and costs nothing while it waits. Cancel it when the answer is ready."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return gone
