"""Dead-letter redrive, as SQS does it (the SQS API's side: app/sqs/redrive.py): a message past its queue's
maxReceiveCount moves into the dead-letter queue its RedrivePolicy names, and a message move task takes
dead letters back.

jobq's own dead letters are dead jobs kept in their queue. For a queue whose RedrivePolicy names another
queue that exists, the queue's dead jobs move into that queue (REDRIVE_DEAD), pending there, to be
received from it as SQS users do; each move is noted with the queue the job came from. A receive from the
queue moves them before it leases (app/service/sqs_messages.py, expire_overdue), so the receive that
would exceed maxReceiveCount finds the message moved, as in SQS; every replica also moves them each
lease-expiry tick (about a second), for dead jobs no receive meets (the queue's consumers gone, a nack
from jobq's API). A queue with no RedrivePolicy, or whose dead-letter queue does not exist, keeps its
dead jobs, for jobq's dead-letter API (GET /dead, POST /dead/retry). The move runs under no key, whoever
received the message: a key limited to queues may name only a dead-letter queue among them, which is
checked where the policy is set (app/sqs/queues.py), not here.

A move task on a dead-letter queue takes its visible messages back to the queues they came from, and
retries the source queues' dead jobs not yet moved, at once (``move_back``).
"""

from __future__ import annotations

from app.db import sql as q
from app.db.pool import Database
from app.db.sql import sqs as sq
from app.service.operators import retry_dead

BATCH = 1000  # jobs per redrive statement


async def dead_letter_sources(db: Database, dlq: str) -> list[str]:
    """The queues whose RedrivePolicy names the queue `dlq` as their dead-letter queue."""
    async with db.acquire() as conn:
        rows = await conn.fetch(sq.DEAD_LETTER_SOURCES.text, *sq.DEAD_LETTER_SOURCES.args(dlq=dlq))
    return [r["name"] for r in rows]


async def move_back(db: Database, dlq: str, sources: list[str]) -> int:
    """Retry the dead jobs of `sources` not yet moved, and take the visible messages of `dlq` that came
    from them back to them; how many jobs went back."""
    moved = 0
    for source in sources:
        moved += (await retry_dead(db, ids=None, queue=source))["retried"]
    return moved + await _return_dead_letters(db, dlq, sources)


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
