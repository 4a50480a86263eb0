"""A request body read up to a limit, for the routes that read their own (the SQS API, the dashboard's
forms). Starlette keeps a body it has read in the request's private ``_body``, where ``request.body()``
finds it again; setting it is reaching into Starlette, so it is done here, in the fast path.
"""

from __future__ import annotations

from fastapi import Request

from app.core.errors import PayloadTooLarge


async def read_body(request: Request, limit: int, what: str = "the request body") -> bytes:
    """`request`'s body, refused (PayloadTooLarge) past `limit` bytes: at once when its Content-Length says
    so, before any of it is read, else as soon as what has come passes it. For routes whose bodies are far
    smaller than JOBQ_MAX_BODY_BYTES (the SQS API, the dashboard's forms); ``request.body()`` gives it
    again afterwards."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > limit):
        raise PayloadTooLarge(f"{what} is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"{what} is over the limit of {limit} bytes")
        chunks.append(chunk)
    request._body = body = b"".join(chunks)
    return body
