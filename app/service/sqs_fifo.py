"""SQS FIFO queues' deduplication and receive attempts, on jobq's own tables (the SQS API's side, and
what a FIFO queue is: app/sqs/fifo.py).

Deduplication. A FIFO message's ``MessageDeduplicationId`` (or, with ContentBasedDeduplication, the hex
SHA-256 of its body) is kept for five minutes as a row of jobq's idempotency keys (`jobq.idempotency_keys`,
the table behind `Idempotency-Key`), written in the transaction that inserts the message, so a key exists
exactly when its message was committed: a send that finds the key taken inserts nothing and answers the
first message's MessageId and SequenceNumber, however long ago that message was deleted. Why that table:
it already is a primary key that makes a second insert wait for the first's commit and then fail (one
message, whatever the timing, on any replica), with expiry, a lookup that ignores expired rows (ANSWERS)
and a pruning loop. What differs from an `Idempotency-Key` is the scope and the answer: the scope is
the queue (``sqs-dedup:<queue>``), or the queue and group with DeduplicationScope messageGroup
(``sqs-dedup:<queue>/<group>``; a queue name holds no "/"), never the credential, since SQS deduplicates
whoever sends; and a repeat with another body is still a duplicate (SQS compares the ids only), not a
conflict. The interval is SQS's five minutes, whatever JOBQ_IDEMPOTENCY_TTL says.

Receive attempts. A FIFO ReceiveMessage with a ``ReceiveRequestAttemptId`` keeps the ids and lease tokens
of what it received for five minutes, in `jobq.sqs_receive_attempts` (any replica answers a retry). The
same attempt id again gets back the messages still in flight under those leases, with the same receipt
handles and their visibility timeout started again; once none is (all deleted, made visible, or expired),
the attempt id receives anew. Two receives with one attempt id at once: the second to keep its answer
hands its messages back (jobq's release, the receive not counted) and answers the first's; whether the
first's are still in flight is judged once its row is locked, by a statement that sees its leases.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import asyncpg

from app.core.errors import Unavailable
from app.core.tokens import parse_token
from app.db import sql as q
from app.db.pool import Database
from app.db.sql import sqs as sq
from app.service.arguments import JobLease
from app.service.rows import Row, as_job
from app.service.upkeep import prune_in_batches
from app.service.workers import release

# SQS's deduplication interval, seconds: of MessageDeduplicationId and of ReceiveRequestAttemptId.
DEDUPLICATION_INTERVAL = 300.0
KEY_ROUNDS = 10  # tries of a send whose deduplication ids keep being taken (or expiring) under it


def _scope(queue: str, per_group: bool, group: str) -> str:
    return f"sqs-dedup:{queue}/{group}" if per_group else f"sqs-dedup:{queue}"


async def forget_deduplication_ids(conn: asyncpg.Connection, queue: str) -> None:
    """Forget every deduplication id the queue keeps, of its own scope and of each group's (in the
    caller's transaction): PurgeQueue's, after which SQS takes a message sent again under an id as new."""
    scopes = {"scope": _scope(queue, False, ""), "group_prefix": _scope(queue, True, "")}
    await conn.execute(sq.FORGET_DEDUPLICATION_IDS.text, *sq.FORGET_DEDUPLICATION_IDS.args(**scopes))


class Deduplicated(Protocol):
    @property
    def body(self) -> str: ...
    @property
    def group(self) -> str | None: ...
    @property
    def dedup(self) -> str | None: ...


Keep = Callable[[asyncpg.Connection, list[Row]], Awaitable[None]]
# Inserts messages as jobs, running a Keep in the same transaction; the jobs, in order.
Enqueue = Callable[[list[Any], Keep], Awaitable[list[Row]]]


async def send_once(
    db: Database, queue: str, per_group: bool, messages: Sequence[Deduplicated], enqueue: Enqueue
) -> list[int]:
    """Send FIFO messages, each at most once per deduplication id and interval (within its group, with
    `per_group`): the job id of each, new or the one its id first sent. As enqueue_once does for
    idempotency keys: insert the messages with their keys; when a key is taken (the statement fails,
    inserting nothing), answer those messages with the kept ids and insert the others again."""
    keys = [(_scope(queue, per_group, m.group or ""), m.dedup or "") for m in messages]
    ids: list[int | None] = [None] * len(messages)
    # One id twice in a request: the later message is a duplicate of the first.
    lead: dict[tuple[str, str], int] = {}
    followers: list[tuple[int, int]] = []
    for i, key in enumerate(keys):
        if key in lead:
            followers.append((i, lead[key]))
        else:
            lead[key] = i
    todo = list(lead.values())
    for _ in range(KEY_ROUNDS):
        chosen = list(todo)

        async def keep(conn: asyncpg.Connection, rows: list[Row], chosen: list[int] = chosen) -> None:
            await conn.execute(
                sq.KEEP_DEDUPLICATION_IDS.text,
                *sq.KEEP_DEDUPLICATION_IDS.args(
                    scopes=[keys[i][0] for i in chosen],
                    keys=[keys[i][1] for i in chosen],
                    body_hashes=[hashlib.sha256(messages[i].body.encode()).digest() for i in chosen],
                    ids=[row["id"] for row in rows],
                    interval=DEDUPLICATION_INTERVAL,
                ),
            )

        try:
            rows = await enqueue([messages[i] for i in chosen], keep)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != "pk_idempotency_keys":
                raise
            async with db.acquire() as conn:
                kept = await conn.fetch(
                    q.ANSWERS.text,
                    *q.ANSWERS.args(scopes=[keys[i][0] for i in chosen], keys=[keys[i][1] for i in chosen]),
                )
            first = {(r["scope"], r["key"]): r["ids"][0] for r in kept}
            for i in chosen:
                ids[i] = first.get(keys[i])
            todo = [i for i in chosen if ids[i] is None]
            if not todo:
                break
            continue
        for i, row in zip(chosen, rows, strict=True):
            ids[i] = row["id"]
        todo = []
        break
    if todo:
        raise Unavailable("deduplication ids kept changing hands; retry the request")
    for i, j in followers:
        ids[i] = ids[j]
    return ids  # type: ignore[return-value]


# --- receive attempts ------------------------------------------------------------------------------


async def replay_receive(
    db: Database, queue: str, attempt_id: str, visibility_timeout: float | None
) -> list[Row]:
    """What the receive attempt received that is still in flight under its leases, their visibility
    timeout started again; [] for an attempt unknown, expired or spent."""
    async with db.acquire() as conn:
        rows = await conn.fetch(
            sq.REPLAY_RECEIVE.text,
            *sq.REPLAY_RECEIVE.args(
                queue=queue, attempt_id=attempt_id, visibility_timeout=visibility_timeout
            ),
        )
    return [as_job(r) for r in sorted(rows, key=lambda r: r["ord"])]


async def keep_receive(db: Database, queue: str, attempt_id: str, leased: list[Row]) -> bool:
    """Keep what a receive attempt leased; False when another receive with the same attempt id holds
    messages still in flight (the caller hands its own back and answers those)."""
    attempt = {
        "queue": queue,
        "attempt_id": attempt_id,
        "ids": [job["id"] for job in leased],
        "lease_tokens": [parse_token(job["lease_token"])[0] for job in leased],
        "interval": DEDUPLICATION_INTERVAL,
    }
    key = {"queue": queue, "attempt_id": attempt_id}
    async with db.acquire() as conn:
        for _ in range(KEY_ROUNDS):
            async with conn.transaction():
                if await conn.fetchval(
                    sq.KEEP_RECEIVE_ATTEMPT.text, *sq.KEEP_RECEIVE_ATTEMPT.args(**attempt)
                ):
                    return True
                # Kept already: replaced only if spent, judged by a statement that starts once the
                # attempt's row is locked (so it sees the leases of whoever kept it). Pruned meanwhile:
                # inserted again.
                if await conn.fetchval(sq.LOCK_RECEIVE_ATTEMPT.text, *sq.LOCK_RECEIVE_ATTEMPT.args(**key)):
                    replaced = await conn.fetchval(
                        sq.REPLACE_RECEIVE_ATTEMPT.text, *sq.REPLACE_RECEIVE_ATTEMPT.args(**attempt)
                    )
                    return replaced is not None
    raise Unavailable("a receive attempt id kept changing hands; retry the request")


async def hand_back(db: Database, leased: list[Row]) -> None:
    await release(db, [JobLease(job["id"], job["lease_token"]) for job in leased])


async def prune_receive_attempts(db: Database) -> int:
    """Forget receive attempts past their expiry, in bounded batches; how many went."""
    return await prune_in_batches(db, sq.PRUNE_RECEIVE_ATTEMPTS)
