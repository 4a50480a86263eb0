"""The SQS queue actions: a queue is jobq's queue of the same name, its settings jobq's where jobq has
them (app/sqs/attributes.py) and kept as given where not."""

from __future__ import annotations

import json
from typing import Any

from app import service
from app.db import queries as q
from app.db import sqs_queries as sq
from app.http.middleware.access_log import note
from app.sqs import auth
from app.sqs.attributes import (
    COMPUTED,
    FIFO,
    NO_REDRIVE_MAX_ATTEMPTS,
    SETTABLE,
    check_queue_attributes,
    dead_letter_queue,
    queue_attributes,
)
from app.sqs.context import Context, kept_attributes, queue_row
from app.sqs.params import Body, integer, string
from app.sqs.protocol import (
    FIFO_QUEUE_NAME,
    SQS_QUEUE_NAME,
    SqsError,
    invalid_parameter,
    missing_parameter,
    name_from_url,
    queue_arn,
    queue_does_not_exist,
    queue_url,
)
from app.sqs.tags import check_tags


async def create_queue(ctx: Context, body: Body) -> Body:
    name = string(body, "QueueName")
    assert name is not None
    given = body.get("Attributes")
    fifo = _fifo_asked(given)
    if fifo:
        if not FIFO_QUEUE_NAME.match(name):
            raise invalid_parameter(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                "underscores, must end with .fifo suffix and be 1 to 80 in length."
            )
    elif not SQS_QUEUE_NAME.match(name):
        # A .fifo name without FifoQueue=true is refused as SQS refuses it.
        raise invalid_parameter(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    keep, settings = check_queue_attributes(given, fifo=fifo, creating=True)
    _admit_dead_letter_queue(ctx, keep)
    tags = check_tags(body["tags"], "tags") if body.get("tags") is not None else {}
    async with ctx.runtime.db.acquire() as conn:
        existing = await conn.fetchrow(sq.QUEUE.text, *sq.QUEUE.args(queue=name))
    if existing is not None:
        # Creating an existing queue is fine when it asks for nothing different.
        shown = queue_attributes(existing, {"pending": 0, "running": 0, "scheduled": 0})
        for attribute, value in (given or {}).items():
            mine = shown.get(attribute)
            if attribute == "FifoQueue":
                same = (mine or "false") == ("true" if fifo else "false")
            elif attribute == "RedrivePolicy" and value:
                same = mine is not None and json.loads(mine) == json.loads(keep[attribute])
            else:
                same = mine == value
            if not same:
                raise SqsError(
                    "QueueNameExists",
                    "A queue already exists with the same name and a different value for attribute "
                    f"{attribute}",
                    query_code="QueueAlreadyExists",
                )
        return {"QueueUrl": queue_url(ctx.base_url, name)}
    async with ctx.runtime.db.acquire() as conn:
        if await conn.fetchval(sq.DELETED_RECENTLY.text, *sq.DELETED_RECENTLY.args(queue=name)):
            raise SqsError(
                "QueueDeletedRecently",
                f"You must wait {sq.SQS_NAME_HOLD} seconds after deleting a queue before you can create"
                " another with the same name.",
                query_code="AWS.SimpleQueueService.QueueDeletedRecently",
            )
    settings.setdefault("max_attempts", NO_REDRIVE_MAX_ATTEMPTS)
    if fifo:
        # A FIFO queue is jobq's keyed flow control with one job of a key at a time, in order: each
        # message group's messages one at a time, in order, a message waiting for its retry holding
        # its group (app/sqs/fifo.py).
        settings["flow"] = {"key_concurrency": 1}
    await _configure(ctx, name, keep, settings)
    if tags:  # an existing queue keeps its own, as in SQS
        async with ctx.runtime.db.acquire() as conn:
            await conn.execute(sq.SET_SQS_TAGS.text, *sq.SET_SQS_TAGS.args(queue=name, tags=json.dumps(tags)))
    return {"QueueUrl": queue_url(ctx.base_url, name)}


def _fifo_asked(attributes: Any) -> bool:
    """Whether CreateQueue's Attributes ask for a FIFO queue (FifoQueue "true"; "false" or none: standard)."""
    if not isinstance(attributes, dict) or "FifoQueue" not in attributes:
        return False
    value = attributes["FifoQueue"]
    if not isinstance(value, str) or value.lower() not in ("true", "false"):
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoQueue. Reason: must be true or false.",
        )
    return value.lower() == "true"


def _admit_dead_letter_queue(ctx: Context, keep: dict[str, str]) -> None:
    """AccessDenied, nothing changed, when a RedrivePolicy names a dead-letter queue outside the key's
    queues (scoped admins' too). The move into it runs inside jobq, under no key, whoever received the
    message: so the check is here, where the policy is set, and a policy set by a key that may use its
    dead-letter queue stays in force for every key that receives from the queue. RedriveAllowPolicy's
    sourceQueueArns and Policy name queues too, but jobq keeps them without effect: they reach no
    queue, and are not checked."""
    target = dead_letter_queue(keep)
    if target is not None:
        auth.admit_queue(ctx.grant, target)


async def _configure(ctx: Context, name: str, keep: dict[str, str], settings: dict[str, Any]) -> None:
    await service.configure_queue(ctx.runtime, name, service.QueueSettings(**settings))
    removed = [k for k, v in keep.items() if v == ""]
    kept = {k: v for k, v in keep.items() if v != ""}
    async with ctx.runtime.db.acquire() as conn:
        await conn.execute(
            sq.SET_SQS_ATTRIBUTES.text,
            *sq.SET_SQS_ATTRIBUTES.args(queue=name, attributes=json.dumps(kept), removed=removed),
        )


async def get_queue_url(ctx: Context, body: Body) -> Body:
    name = string(body, "QueueName")
    assert name is not None
    await queue_row(ctx, name)
    return {"QueueUrl": queue_url(ctx.base_url, name)}


async def list_queues(ctx: Context, body: Body) -> Body:
    prefix = string(body, "QueueNamePrefix", required=False) or ""
    limit = integer(body, "MaxResults", 1, 1000, None)
    after = string(body, "NextToken", required=False) or ""
    async with ctx.runtime.db.acquire() as conn:
        rows = await conn.fetch(
            sq.LIST_QUEUES.text,
            *sq.LIST_QUEUES.args(prefix=prefix, after=after, limit=(limit or 1000) + 1, scope=ctx.grant.like),
        )
    names = [r["name"] for r in rows]
    # No match: no QueueUrls at all, as SQS answers (not an empty list).
    out: Body = {"QueueUrls": [queue_url(ctx.base_url, n) for n in names[: limit or 1000]]} if names else {}
    if limit is not None and len(names) > limit:
        out["NextToken"] = names[limit - 1]
    return out


async def delete_queue(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    async with ctx.runtime.db.acquire() as conn, conn.transaction():
        # Two statements: the delete's snapshot must be taken once the lock is held (q.LOCK_QUEUE).
        await conn.execute(q.LOCK_QUEUE.text, *q.LOCK_QUEUE.args(queue=name))
        gone = await conn.fetchval(q.DELETE_QUEUE.text, *q.DELETE_QUEUE.args(queue=name))
        if gone is not None:
            await conn.execute(sq.NOTE_DELETED_QUEUE.text, *sq.NOTE_DELETED_QUEUE.args(queue=name))
    if gone is None:
        raise queue_does_not_exist(name)
    return {}


async def purge_queue(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    await queue_row(ctx, name)
    async with ctx.runtime.db.acquire() as conn, conn.transaction():
        if await conn.fetchval(sq.TAKE_PURGE_TURN.text, *sq.TAKE_PURGE_TURN.args(queue=name)) is None:
            raise SqsError(
                "PurgeQueueInProgress",
                f"Only one PurgeQueue operation on {name} is allowed every {sq.SQS_NAME_HOLD} seconds.",
                status=403,
                query_code="AWS.SimpleQueueService.PurgeQueueInProgress",
            )
        await conn.execute(q.PURGE_QUEUE.text, *q.PURGE_QUEUE.args(queue=name))
    return {}


async def get_queue_attributes(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    wanted = body.get("AttributeNames") or []
    if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
        raise invalid_parameter("AttributeNames must be a list of attribute names.")
    row = await queue_row(ctx, name)
    stats = await service.queue(ctx.runtime.db, name)
    everything = queue_attributes(row, stats)
    for w in wanted:
        # A standard queue has no FIFO attributes: asking for one by name is an error, as in SQS.
        if (w not in COMPUTED and w not in SETTABLE) or (w in FIFO and w not in everything):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    if "All" in wanted:
        return {"Attributes": everything}
    return {"Attributes": {w: everything[w] for w in wanted if w in everything}}


async def set_queue_attributes(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    if body.get("Attributes") is None:
        raise missing_parameter("Attributes")
    row = await queue_row(ctx, name)
    kept = kept_attributes(row)
    keep, settings = check_queue_attributes(
        body.get("Attributes"), fifo=kept.get("FifoQueue") == "true", creating=False, current=kept
    )
    _admit_dead_letter_queue(ctx, keep)
    await _configure(ctx, name, keep, settings)
    return {}


async def list_dead_letter_source_queues(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    await queue_row(ctx, name)
    async with ctx.runtime.db.acquire() as conn:
        rows = await conn.fetch(
            sq.DEAD_LETTER_SOURCES.text, *sq.DEAD_LETTER_SOURCES.args(arn=queue_arn(name))
        )
    names = [r["name"] for r in rows if ctx.grant.admits(r["name"])]
    return {"queueUrls": [queue_url(ctx.base_url, name) for name in names]}
