"""What every SQS action is given (``Context``), and the queue a request names, looked up."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from app.core.access import OPEN, Grant
from app.http.middleware.access_log import note
from app.service import sqs_queues
from app.service.runtime import Runtime
from app.sqs.protocol import queue_does_not_exist


@dataclass
class MoveTask:
    """A message move task (app/sqs/redrive.py), remembered for ListMessageMoveTasks."""

    handle: str
    source_arn: str
    destination_arn: str | None
    moved: int
    started: int  # epoch milliseconds


@dataclass
class Context:
    runtime: Runtime
    base_url: str  # scheme://host:port the request came to, for queue URLs
    disconnected: Callable[[], Awaitable[object]] | None = None  # returns once the client has gone
    move_tasks: list[MoveTask] = field(default_factory=list)
    # The signing key's roles and queues. The queues a request names were checked before the action
    # (app/sqs/auth.py admit); those an action finds itself it checks or filters with this.
    grant: Grant = OPEN
    trace_header: str | None = None  # the request's X-Amzn-Trace-Id: a send's AWSTraceHeader if it has none


async def queue_row(ctx: Context, name: str) -> asyncpg.Record:
    """The queue as SQS shows it (app/service/sqs_queues.py find_queue); QueueDoesNotExist without one.
    Names it in the access log."""
    note(queue=name)
    row = await sqs_queues.find_queue(ctx.runtime.db, name)
    if row is None:
        raise queue_does_not_exist(name)
    return row


def kept_attributes(row: asyncpg.Record) -> dict[str, str]:
    """The queue's attributes SQS set and jobq keeps as given (queues.sqs_attributes)."""
    kept = row["sqs_attributes"]
    return json.loads(kept) if isinstance(kept, str) else kept
