"""Dead-letter redrive: a message move task moves dead messages back to the queue they died in.

jobq keeps a queue's dead letters in the queue itself (dead jobs), not in another queue, so a move task
retries the dead jobs of the queues whose RedrivePolicy names the dead-letter queue, at once: it is
complete by the time StartMessageMoveTask answers. The latest hundred tasks are remembered per process,
for ListMessageMoveTasks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from app import jobs
from app.sqs import auth
from app.sqs import queries as sq
from app.sqs.context import Context, queue_row
from app.sqs.params import Body, integer, string
from app.sqs.protocol import SqsError, name_from_arn


@dataclass
class MoveTask:
    handle: str
    source_arn: str
    destination_arn: str | None
    moved: int
    started: int  # epoch milliseconds


async def _redrive_sources(ctx: Context, source_arn: str) -> list[str]:
    """The queues whose dead jobs a move task from `source_arn` moves back: those whose RedrivePolicy
    names it as their dead-letter queue, or else the queue the ARN names itself (its own dead jobs)."""
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(sq.DEAD_LETTER_SOURCES.text, *sq.DEAD_LETTER_SOURCES.args(arn=source_arn))
    if rows:
        return [r["name"] for r in rows]
    name = name_from_arn(source_arn, "SourceArn")
    await queue_row(ctx, name)
    return [name]


async def start_message_move_task(ctx: Context, body: Body) -> Body:
    source_arn = string(body, "SourceArn")
    assert source_arn is not None
    destination_arn = string(body, "DestinationArn", required=False)
    sources = await _redrive_sources(ctx, source_arn)
    if destination_arn is not None:
        destination = name_from_arn(destination_arn, "DestinationArn")
        if destination not in sources:
            raise SqsError(
                "UnsupportedOperation",
                "jobq moves dead messages back to the queue they died in only; DestinationArn must be "
                "one of the source queues of the dead-letter queue.",
                query_code="AWS.SimpleQueueService.UnsupportedOperation",
            )
        sources = [destination]
    for source in sources:  # a dead-letter queue's sources may lie outside the key's queues
        if not ctx.grant.admits(source):
            raise auth.denied_queue(ctx.grant, source)
    moved = 0
    for source in sources:
        moved += (await jobs.retry_dead(ctx.db, ids=None, queue=source))["retried"]
    task = MoveTask(str(uuid.uuid4()), source_arn, destination_arn, moved, int(time.time() * 1000))
    ctx.move_tasks.append(task)
    del ctx.move_tasks[:-100]  # the latest hundred are remembered
    return {"TaskHandle": task.handle}


async def list_message_move_tasks(ctx: Context, body: Body) -> Body:
    source_arn = string(body, "SourceArn")
    limit = integer(body, "MaxResults", 1, 10, 1)
    tasks = [t for t in reversed(ctx.move_tasks) if t.source_arn == source_arn][: limit or 1]
    results = []
    for task in tasks:
        result: Body = {
            "TaskHandle": task.handle,
            "Status": "COMPLETED",
            "SourceArn": task.source_arn,
            "ApproximateNumberOfMessagesMoved": task.moved,
            "ApproximateNumberOfMessagesToMove": task.moved,
            "StartedTimestamp": task.started,
        }
        if task.destination_arn:
            result["DestinationArn"] = task.destination_arn
        results.append(result)
    return {"Results": results}
