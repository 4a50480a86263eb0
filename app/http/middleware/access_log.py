"""Each request, observed once: its latency into the metrics, and one JSON line on the ``jobq.access``
logger.

The line names the route template (``/jobs/{id}``, so lines group by route), the method, the status,
the duration in milliseconds, the queue when the request names one, and the number of jobs for batches
and leases; never a payload:

    {"time": "2024-05-01T12:00:03.117Z", "level": "info", "logger": "jobq.access",
     "message": "POST /lease 200", "method": "POST", "route": "/lease", "path": "/lease", "status": 200,
     "duration_ms": 2.41, "client": "10.0.0.7", "queue": "emails", "jobs": 10}

Logging is configured through ``logging``: unless something else has configured ``jobq.access``, the app
gives it a handler writing these lines to stderr (``install``). Lines are written at INFO, so they follow
the log level (``jobq serve --log-level warning`` silences them); ``JOBQ_ACCESS_LOG=false`` turns them off.

The middleware is plain ASGI (no ``BaseHTTPMiddleware``, which would run every request through extra
tasks and queues): it wraps ``send`` to see the status and times the call. With the line on, it also
keeps the request body's chunks as they pass (up to ``MAX_BODY_PEEK``), and reads the queue and batch
size from them after the answer has gone out, so that no route needs to know about the log.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qs

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.telemetry.metrics import Metrics

log = logging.getLogger("jobq.access")

UNMATCHED = "<unmatched>"  # the route of a request no route matched (404): raw paths would be unbounded


MAX_BODY_PEEK = 1024 * 1024  # bytes of a request body kept for its line's queue and job count (1 MiB)


class RequestNote:
    """The current request's line in the making: its body as it streamed in, and what the handler adds
    (see ``note``)."""

    __slots__ = ("queue", "jobs", "body", "size")

    def __init__(self) -> None:
        self.queue: str | None = None
        self.jobs: int | None = None
        self.body: list[bytes] = []
        self.size = 0


_note: ContextVar[RequestNote | None] = ContextVar("jobq_request_note", default=None)


def note(*, queue: str | None = None, jobs: int | None = None) -> None:
    """Add the queue or the number of jobs to the current request's line; nothing outside a request
    (or with the access log off). For the HTTP handlers (app/http/routers/, app/sqs/), never the service
    layer; and from the request's own task: a shared statement's task (app/service/coalesce.py) belongs to no
    single request."""
    current = _note.get()
    if current is not None:
        if queue is not None:
            current.queue = queue
        if jobs is not None:
            current.jobs = jobs


class ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: Metrics, access_log: bool) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what the server answers when the app fails before starting a response
        started = time.perf_counter()

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        current = RequestNote() if self.access_log and log.isEnabledFor(logging.INFO) else None
        if current is not None:
            # The body is kept as it streams past (no copy), and read for the line once the answer is out.
            async def kept_receive() -> Message:
                message = await receive()
                chunk = message.get("body")
                if chunk and current.size <= MAX_BODY_PEEK:
                    current.body.append(chunk)
                    current.size += len(chunk)
                return message

            token = _note.set(current)
        try:
            await self.app(scope, receive if current is None else kept_receive, observed_send)
        finally:
            seconds = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.metrics.request(scope["method"], template, status, seconds)
            if current is not None:
                _note.reset(token)
                _log_line(scope, template, status, seconds, current)


def _request_facts(scope: Scope, current: RequestNote) -> tuple[str | None, int | None]:
    """The queue the request names (path, query or JSON body) and its batch size (jobs, items or ids)."""
    queue = scope.get("path_params", {}).get("queue")
    jobs = None
    query = scope.get("query_string", b"")
    if not queue and b"queue=" in query:
        queue = parse_qs(query.decode("latin-1")).get("queue", [None])[0]
    if current.body and current.size <= MAX_BODY_PEEK:
        try:
            body = orjson.loads(b"".join(current.body) if len(current.body) > 1 else current.body[0])
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            if isinstance(body.get("queue"), str):
                queue = body["queue"]
            for key in ("jobs", "items", "ids"):
                batch = body.get(key)
                if isinstance(batch, list):
                    jobs = len(batch)
                    if key == "jobs":
                        queues = {job.get("queue") for job in batch if isinstance(job, dict)}
                        if len(queues) == 1:
                            queue = queues.pop()
                    break
    return current.queue or queue, current.jobs if current.jobs is not None else jobs


def _log_line(scope: Scope, template: str, status: int, seconds: float, current: RequestNote) -> None:
    method = scope["method"]
    fields: dict[str, Any] = {
        "method": method,
        "route": template,
        "path": scope["path"],
        "status": status,
        "duration_ms": round(seconds * 1000, 2),
    }
    client = scope.get("client")
    if client:
        fields["client"] = client[0]
    queue, jobs = _request_facts(scope, current)
    if isinstance(queue, str):
        fields["queue"] = queue
    if jobs is not None:
        fields["jobs"] = jobs
    # makeRecord and handle, as log.info would, less its search of the stack for the caller's line.
    record = log.makeRecord(log.name, logging.INFO, "", 0, "%s %s %s", (method, template, status), None)
    record.fields = fields
    log.handle(record)


class JSONFormatter(logging.Formatter):
    """A log record as one JSON object: time, level, logger, message, and the record's ``fields``."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def _time(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # the date and time to the second, formatted once a second
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def install() -> None:
    """Give ``jobq.access`` a JSON handler on stderr, unless the application's logging configuration
    has given it handlers already. Its lines do not also go up to the root logger's handlers."""
    if log.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter())
    log.addHandler(handler)
    log.propagate = False
