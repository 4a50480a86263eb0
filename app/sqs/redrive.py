"""StartMessageMoveTask and ListMessageMoveTasks: SQS's dead-letter redrive, on jobq's own dead jobs (what a
RedrivePolicy does, and the move of dead letters by the receive that meets them and every tick:
app/service/redrive.py).

StartMessageMoveTask on a dead-letter queue takes its visible messages back to the queues they came from,
and retries the source queues' dead jobs not yet moved, at once: it is complete by the time it answers.
The latest hundred tasks are remembered per process, for ListMessageMoveTasks.
"""

from __future__ import annotations

import time
import uuid

from app.service import redrive
from app.sqs import auth
from app.sqs.context import Context, MoveTask, queue_row
from app.sqs.params import Body, integer, string
from app.sqs.protocol import SqsError


async def _redrive_sources(ctx: Context, dlq: str) -> list[str]:
    """The queues whose dead jobs a move task from the queue `dlq` moves back: those whose RedrivePolicy
    names it as their dead-letter queue, or else `dlq` itself (its own dead jobs)."""
    sources = await redrive.dead_letter_sources(ctx.runtime.db, dlq)
    if sources:
        return sources
    await queue_row(ctx, dlq)
    return [dlq]


async def start_message_move_task(ctx: Context, body: Body) -> Body:
    source_arn = string(body, "SourceArn")
    assert source_arn is not None
    destination_arn = string(body, "DestinationArn", required=False)
    dlq = ctx.of_arn(source_arn, "SourceArn")
    sources = await _redrive_sources(ctx, dlq)
    if destination_arn is not None:
        destination = ctx.of_arn(destination_arn, "DestinationArn")
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
    moved = await redrive.move_back(ctx.runtime.db, dlq, sources)
    task = MoveTask(str(uuid.uuid4()), dlq, source_arn, destination_arn, moved, int(time.time() * 1000))
    ctx.move_tasks.append(task)
    del ctx.move_tasks[:-100]  # the latest hundred are remembered
    return {"TaskHandle": task.handle}


async def list_message_move_tasks(ctx: Context, body: Body) -> Body:
    dlq = ctx.of_arn(string(body, "SourceArn"), "SourceArn")
    limit = integer(body, "MaxResults", 1, 10, 1)
    tasks = [t for t in reversed(ctx.move_tasks) if t.queue == dlq][: limit or 1]
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
