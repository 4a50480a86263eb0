"""Dead-letter redrive, as SQS does it: a message past its queue's maxReceiveCount moves into the
dead-letter queue its RedrivePolicy names, and a message move task takes dead letters back.

jobq's own dead letters are dead jobs kept in their queue. For a queue whose RedrivePolicy names another
queue that exists, every replica moves the queue's dead jobs into that queue each lease-expiry tick (about
a second: REDRIVE_DEAD), pending there, to be received from it as SQS users do; each move is noted with
the queue the job came from. A queue with no RedrivePolicy, or whose dead-letter queue does not exist,
keeps its dead jobs, for jobq's dead-letter API (GET /dead, POST /dead/retry). The move runs under no
key, whoever received the message: a key limited to queues may name only a dead-letter queue among
them, which is checked where the policy is set (app/sqs/queues.py), not here.

StartMessageMoveTask on a dead-letter queue takes its visible messages back to the queues they came from,
and retries the source queues' dead jobs not yet moved, at once: it is complete by the time it answers.
The latest hundred tasks are remembered per process, for ListMessageMoveTasks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from app import service
from app.db import queries as q
from app.db import sqs_queries as sq
from app.db.pool import Database
from app.sqs import auth
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
    async with ctx.runtime.db.acquire() as conn:
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
        moved += (await service.retry_dead(ctx.runtime.db, ids=None, queue=source))["retried"]
    moved += await _return_dead_letters(ctx.runtime.db, name_from_arn(source_arn, "SourceArn"), sources)
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


BATCH = 1000  # jobs per redrive statement


async def move_dead_letters(db: Database) -> int:
    """REDRIVE_DEAD until a batch comes back short: how many jobs moved into dead-letter queues."""
    moved = 0
    async with db.acquire() as conn:
        while True:
            rows = await conn.fetch(q.REDRIVE_DEAD.text, *q.REDRIVE_DEAD.args(batch=BATCH))
            moved += len(rows)
            if len(rows) < BATCH:
                return moved


async def forget_dead_letters(db: Database) -> int:
    """Drop the notes of moved jobs that left their dead-letter queue otherwise; how many."""
    async with db.acquire() as conn:
        tag = await conn.execute(q.FORGET_DEAD_LETTERS.text, *q.FORGET_DEAD_LETTERS.args(batch=BATCH))
    return int(tag.split()[-1])


async def _return_dead_letters(db: Database, dlq: str, sources: list[str]) -> int:
    """RETURN_DEAD_LETTERS until a batch comes back short: how many went back to `sources`."""
    moved = 0
    async with db.acquire() as conn:
        while True:
            args = q.RETURN_DEAD_LETTERS.args(dlq=dlq, sources=sources, batch=BATCH)
            batch = await conn.fetchval(q.RETURN_DEAD_LETTERS.text, *args)
            moved += batch
            if batch < BATCH:
                return moved
