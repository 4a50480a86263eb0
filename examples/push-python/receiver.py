"""A receiver of jobq's push delivery, on Starlette: the service POSTs each job of a queue configured with
a push URL here, signed with the queue's secret, and this app's answer settles the job.

    pip install jobq starlette uvicorn
    JOBQ_PUSH_SECRET=whsec_... uvicorn receiver:app --port 9000    # in examples/push-python

A 200 completes the job, its JSON body the job's result; a 503 with Retry-After puts the job back for that
many seconds, the attempt not counted; a 500 fails the attempt (retried after the queue's backoff while
attempts remain, then dead); a 401 answers a request that is not the service's.
"""

import logging
import os
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import jobq

log = logging.getLogger("receiver")
SECRET = os.environ["JOBQ_PUSH_SECRET"]  # the queue's, as jobq gave it: whsec_ and base64


class Later(Exception):
    """Raised by a handler that wants its job again in `seconds`: not a failure."""

    def __init__(self, seconds: int) -> None:
        super().__init__(f"later, in {seconds} s")
        self.seconds = seconds


# The work, one handler per kind. Replace them with yours: each takes the job's payload and returns its
# result (any JSON value); what it raises fails the attempt.
async def send_email(payload: dict[str, Any]) -> Any:
    if "@" not in payload["to"]:
        raise ValueError(f"not an address: {payload['to']!r}")
    return {"sent_to": payload["to"]}


async def monthly_report(payload: dict[str, Any]) -> Any:
    if payload["month"] >= datetime.now(UTC).strftime("%Y-%m"):
        raise Later(3600)  # the month is not over yet: ask again in an hour
    return {"month": payload["month"], "total": 0}


HANDLERS = {"send_email": send_email, "monthly_report": monthly_report}


async def receive(request: Request) -> Response:
    body = await request.body()  # the raw bytes: the signature covers them exactly
    try:
        job = jobq.verify_push(request.headers, body, SECRET)
    except jobq.PushVerificationError as exc:
        log.warning("refused a push: %s", exc)
        return JSONResponse({"error": str(exc)}, status_code=401)
    # webhook-id (job_<id>) is the same on every attempt: a job whose answer was lost comes again. A
    # handler whose work must not be done twice records the id with its work, and skips it when found.
    handler = HANDLERS.get(job["kind"] or "")
    try:
        if handler is None:
            raise LookupError(f"no handler for kind {job['kind']!r}")
        result = await handler(job["payload"])
    except Later as later:
        return Response(status_code=503, headers={"Retry-After": str(later.seconds)})
    except Exception as exc:
        log.exception("job %s (attempt %s) failed", job["id"], request.headers.get("jobq-attempt"))
        return JSONResponse({"error": repr(exc)}, status_code=500)
    return JSONResponse(result)


app = Starlette(routes=[Route("/jobs", receive, methods=["POST"])])
