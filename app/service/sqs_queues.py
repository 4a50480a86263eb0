"""SQS queues in jobq's tables (the SQS API's side: app/sqs/queues.py and app/sqs/tags.py): a queue is a jobq
queue (of the same name in the default region: app/sqs/regions.py), with the SQS attributes jobq has no
setting for kept as given beside it (`sqs_attributes`), and its tags (`sqs_tags`). A queue deleted through
SQS is noted, so that its name is held for a minute, as SQS holds it; so is the time of its last purge,
which SQS allows once a minute."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from app.db import sql as q
from app.db.pool import Database
from app.db.sql import sqs as sq
from app.service import sqs_fifo
from app.service.arguments import QueueSettingsLike
from app.service.operators import configure_queue
from app.service.rows import Scope
from app.service.runtime import Runtime


async def find_queue(db: Database, name: str) -> asyncpg.Record | None:
    """The queue as SQS shows it (sq.QUEUE); None when there is none."""
    async with db.acquire() as conn:
        return await conn.fetchrow(sq.QUEUE.text, *sq.QUEUE.args(queue=name))


async def deleted_recently(db: Database, name: str) -> bool:
    """Whether a queue of this name was deleted through SQS in the last minute (sq.SQS_NAME_HOLD)."""
    async with db.acquire() as conn:
        return await conn.fetchval(sq.DELETED_RECENTLY.text, *sq.DELETED_RECENTLY.args(queue=name))


async def configure(runtime: Runtime, name: str, keep: dict[str, str], settings: QueueSettingsLike) -> None:
    """Set the queue's jobq settings (creating it if need be), then keep the SQS attributes `keep` as given;
    an attribute given as "" is removed."""
    await configure_queue(runtime, name, settings)
    removed = [k for k, v in keep.items() if v == ""]
    kept = {k: v for k, v in keep.items() if v != ""}
    async with runtime.db.acquire() as conn:
        await conn.execute(
            sq.SET_SQS_ATTRIBUTES.text,
            *sq.SET_SQS_ATTRIBUTES.args(queue=name, attributes=json.dumps(kept), removed=removed),
        )


async def list_queues(
    db: Database, prefix: str, after: str, limit: int, scope: Scope, others: list[str]
) -> list[str]:
    """The names of up to `limit` queues starting with `prefix` and with none of `others`, after `after`,
    in name order."""
    args = sq.LIST_QUEUES.args(prefix=prefix, after=after, limit=limit, scope=scope, others=others)
    async with db.acquire() as conn:
        rows = await conn.fetch(sq.LIST_QUEUES.text, *args)
    return [r["name"] for r in rows]


async def delete_queue(db: Database, name: str) -> bool:
    """Delete the queue and its jobs, and hold its name; False when there was no such queue."""
    async with db.acquire() as conn, conn.transaction():
        # Two statements: the delete's snapshot must be taken once the lock is held (q.LOCK_QUEUE).
        await conn.execute(q.LOCK_QUEUE.text, *q.LOCK_QUEUE.args(queue=name))
        gone = await conn.fetchval(q.DELETE_QUEUE.text, *q.DELETE_QUEUE.args(queue=name))
        if gone is not None:
            await conn.execute(sq.NOTE_DELETED_QUEUE.text, *sq.NOTE_DELETED_QUEUE.args(queue=name))
    return gone is not None


async def purge_queue(db: Database, name: str, *, fifo: bool) -> bool:
    """Delete the queue's jobs, and a FIFO queue's deduplication ids, unless it was purged in the last
    minute: then nothing, and False. The ids go first, in a statement of its own: a message sent between
    the two statements keeps its id and is purged with the rest, as SQS may purge what is sent during a
    purge, where the other order would let that message be sent twice."""
    async with db.acquire() as conn, conn.transaction():
        if await conn.fetchval(sq.TAKE_PURGE_TURN.text, *sq.TAKE_PURGE_TURN.args(queue=name)) is None:
            return False
        if fifo:
            await sqs_fifo.forget_deduplication_ids(conn, name)
        await conn.execute(q.PURGE_QUEUE.text, *q.PURGE_QUEUE.args(queue=name))
    return True


# --- tags, and the attributes changed with them --------------------------------------------------------


async def queue_tags(db: Database, name: str) -> dict[str, str] | None:
    """The queue's tags; None when there is no such queue."""
    async with db.acquire() as conn:
        tags = await conn.fetchval(sq.QUEUE_TAGS.text, *sq.QUEUE_TAGS.args(queue=name))
    return None if tags is None else _json(tags)


async def set_tags(db: Database, name: str, tags: dict[str, str]) -> None:
    async with db.acquire() as conn:
        await conn.execute(sq.SET_SQS_TAGS.text, *sq.SET_SQS_TAGS.args(queue=name, tags=json.dumps(tags)))


class QueueMeta:
    """A queue's tags and kept attributes, its row locked, for one change."""

    def __init__(self, conn: Any, name: str, row: Any) -> None:
        self._conn, self._name = conn, name
        self.tags: dict[str, str] = _json(row["sqs_tags"])
        self.attributes: dict[str, str] = _json(row["sqs_attributes"])

    async def set_tags(self, tags: dict[str, str]) -> None:
        await self._conn.execute(
            sq.SET_SQS_TAGS.text, *sq.SET_SQS_TAGS.args(queue=self._name, tags=json.dumps(tags))
        )

    async def set_attributes(self, kept: dict[str, str], removed: list[str]) -> None:
        """Keep the attributes `kept` as given, and remove those `removed`."""
        await self._conn.execute(
            sq.SET_SQS_ATTRIBUTES.text,
            *sq.SET_SQS_ATTRIBUTES.args(queue=self._name, attributes=json.dumps(kept), removed=removed),
        )


@asynccontextmanager
async def queue_meta(db: Database, name: str) -> AsyncIterator[QueueMeta | None]:
    """The queue's tags and kept attributes, its row locked until the change is committed (None when there
    is no such queue). An exception out of the block changes nothing."""
    async with db.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(sq.QUEUE_META_FOR_UPDATE.text, *sq.QUEUE_META_FOR_UPDATE.args(queue=name))
        yield None if row is None else QueueMeta(conn, name, row)


def _json(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value)
