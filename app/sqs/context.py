"""What every SQS action is given (``Context``), and the queue a request names, looked up."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from app.core.access import OPEN, Grant
from app.db.pool import Database
from app.http.middleware.access_log import note
from app.service import sqs_queues
from app.service.runtime import Runtime
from app.sqs.protocol import invalid_parameter, queue_does_not_exist
from app.sqs.regions import Regions, arn_parts, url_parts


@dataclass
class MoveTask:
    """A message move task (app/sqs/redrive.py), remembered for ListMessageMoveTasks."""

    handle: str
    queue: str  # the dead-letter queue it moved messages out of
    source_arn: str  # as the task was started with
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
    regions: Regions = Regions(("us-east-1",), strict=False)  # what the service serves (app/sqs/regions.py)
    region: str = "us-east-1"  # the one the request acts in (Regions.of_request)

    def named(self, name: str) -> str:
        """The jobq queue of the SQS queue `name` in the request's region."""
        return self.regions.queue(self.region, name)

    def of_url(self, url: Any) -> str:
        """The jobq queue a QueueUrl names; QueueDoesNotExist for one of another region, as SQS answers."""
        region, name = url_parts(url)
        if region is not None and self.regions.served_as(region) != self.region:
            why = f" in {self.region}: its URL names region {region}, so sign requests for it for {region}"
            raise queue_does_not_exist(name, why)
        return self.named(name)

    def of_arn(self, arn: Any, parameter: str) -> str:
        """The jobq queue an ARN names, in the request's region: a queue, its dead-letter queue and a move
        task's queues are in one region, as in SQS."""
        region, name = arn_parts(arn, parameter)
        if self.regions.served_as(region) != self.region:
            raise invalid_parameter(
                f"Value {arn} for parameter {parameter} is invalid. Reason: it names a queue of region"
                f" {region}, and this request acts in {self.region}: a queue's dead-letter queue and a move"
                " task's queues are in the queue's own region."
            )
        return self.named(name)

    def url(self, queue: str) -> str:
        """The QueueUrl of the jobq queue `queue`, on the host the request came to."""
        return self.regions.url(self.base_url, queue)

    def arn(self, queue: str) -> str:
        return self.regions.arn(queue)


async def queue_row(
    ctx: Context,
    name: str,
    find: Callable[[Database, str], Awaitable[asyncpg.Record | None]] = sqs_queues.find_queue,
) -> asyncpg.Record:
    """The queue as SQS shows it (app/service/sqs_queues.py find_queue, or `find`, which reads more);
    QueueDoesNotExist without one. Names it in the access log."""
    note(queue=name)
    row = await find(ctx.runtime.db, name)
    if row is None:
        raise queue_does_not_exist(name)
    return row


def kept_attributes(row: asyncpg.Record) -> dict[str, str]:
    """The queue's attributes SQS set and jobq keeps as given (queues.sqs_attributes)."""
    kept = row["sqs_attributes"]
    return json.loads(kept) if isinstance(kept, str) else kept
