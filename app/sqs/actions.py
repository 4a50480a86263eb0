"""The SQS actions, each mapped onto jobq's own operations in ``app.jobs``.

A message is a job of the queue of the same name: SendMessage enqueues, ReceiveMessage leases (with
the same long-poll and wake-ups), DeleteMessage acks and ChangeMessageVisibility extends, each under
the lease token the receipt handle carries, so jobq's fencing holds: a handle from an earlier receive
deletes nothing once the message was received again (ReceiptHandleIsInvalid).

The payload is the body: a message's body is stored as a JSON string, so jobq's API, CLI and workers
see exactly the text that was sent; a job enqueued through jobq's API with any other JSON payload is
received through SQS with that JSON text as its body.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
from pydantic import ValidationError

from app import jobs
from app.access_log import note
from app.auth import OPEN, Grant
from app.db import Database
from app.errors import LeaseLost, NotFound
from app.schemas import AckRequest, EnqueueRequest, NackRequest, QueueSettingsPatch
from app.sqs import auth
from app.sqs import queries as sq
from app.sqs.attributes import (
    NO_REDRIVE_MAX_ATTEMPTS,
    check_message_attributes,
    check_message_text,
    check_queue_attributes,
    queue_attributes,
    select_message_attributes,
)
from app.sqs.protocol import (
    BATCH_ENTRY_ID,
    MAX_BATCH,
    SQS_QUEUE_NAME,
    SqsError,
    invalid_parameter,
    md5_of_attributes,
    md5_of_body,
    missing_parameter,
    name_from_arn,
    name_from_url,
    parse_receipt_handle,
    queue_arn,
    queue_does_not_exist,
    queue_url,
    receipt_handle,
    receipt_handle_invalid,
)
from app.wakeups import Wakeups

Body = dict[str, Any]


@dataclass
class MoveTask:
    handle: str
    source_arn: str
    destination_arn: str | None
    moved: int
    started: int  # epoch milliseconds


@dataclass
class Context:
    db: Database
    wakeups: Wakeups
    base_url: str  # scheme://host:port the request came to, for queue URLs
    disconnected: Callable[[], Awaitable[object]] | None = None  # returns once the client has gone
    move_tasks: list[MoveTask] = field(default_factory=list)
    # The signing key's roles and queues. The queues a request names were checked before the action
    # (app/sqs/auth.py admit); those an action finds itself it checks or filters with this.
    grant: Grant = OPEN


# --- parameters ------------------------------------------------------------------------------------


def _string(body: Body, name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise missing_parameter(name)
        return None
    if not isinstance(value, str):
        raise invalid_parameter(f"Value for parameter {name} must be a string.")
    return value


def _integer(body: Body, name: str, low: int, high: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_parameter(
            f"Value {value} for parameter {name} is invalid. Reason: must be between {low} and {high}."
        )
    return value


def _entries(body: Body, name: str) -> list[Body]:
    entries = body.get(name)
    if entries is None:
        raise missing_parameter(name)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid_parameter(f"{name} must be a list of entries.")
    if not entries:
        raise SqsError(
            "EmptyBatchRequest",
            "There should be at least one entry in the request.",
            query_code="AWS.SimpleQueueService.EmptyBatchRequest",
        )
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
            query_code="AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        )
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not BATCH_ENTRY_ID.match(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
                query_code="AWS.SimpleQueueService.InvalidBatchEntryId",
            )
    if len(set(ids)) != len(ids):
        raise SqsError(
            "BatchEntryIdsNotDistinct",
            "Two or more batch entries in the request have the same Id.",
            query_code="AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        )
    return entries


def _failed(entry_id: str, error: SqsError) -> Body:
    return {"Id": entry_id, "SenderFault": error.sender_fault, "Code": error.code, "Message": error.message}


async def _queue(ctx: Context, name: str) -> asyncpg.Record:
    note(queue=name)
    async with ctx.db.acquire() as conn:
        row = await conn.fetchrow(sq.QUEUE.text, *sq.QUEUE.args(queue=name))
    if row is None:
        raise queue_does_not_exist(name)
    return row


def _kept(row: asyncpg.Record) -> dict[str, str]:
    kept = row["sqs_attributes"]
    return json.loads(kept) if isinstance(kept, str) else kept


# --- queues ----------------------------------------------------------------------------------------


async def create_queue(ctx: Context, body: Body) -> Body:
    name = _string(body, "QueueName")
    assert name is not None
    if not SQS_QUEUE_NAME.match(name):
        if name.endswith(".fifo"):
            raise SqsError(
                "UnsupportedOperation",
                "jobq serves standard queues only; FIFO queues are not supported.",
                query_code="AWS.SimpleQueueService.UnsupportedOperation",
            )
        raise invalid_parameter(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    keep, settings = check_queue_attributes(body.get("Attributes"))
    async with ctx.db.acquire() as conn:
        existing = await conn.fetchrow(sq.QUEUE.text, *sq.QUEUE.args(queue=name))
    if existing is not None:
        # Creating an existing queue is fine when it asks for nothing different.
        shown = queue_attributes(existing, {"pending": 0, "running": 0, "scheduled": 0})
        for attribute, value in (body.get("Attributes") or {}).items():
            if attribute in ("FifoQueue",):
                continue
            mine = shown.get(attribute)
            if attribute == "RedrivePolicy" and value:
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
    settings.setdefault("max_attempts", NO_REDRIVE_MAX_ATTEMPTS)
    await _configure(ctx, name, keep, settings)
    return {"QueueUrl": queue_url(ctx.base_url, name)}


async def _configure(ctx: Context, name: str, keep: dict[str, str], settings: dict[str, Any]) -> None:
    await jobs.configure_queue(ctx.db, name, QueueSettingsPatch(**settings))
    removed = [k for k, v in keep.items() if v == ""]
    kept = {k: v for k, v in keep.items() if v != ""}
    async with ctx.db.acquire() as conn:
        await conn.execute(
            sq.SET_SQS_ATTRIBUTES.text,
            *sq.SET_SQS_ATTRIBUTES.args(queue=name, attributes=json.dumps(kept), removed=removed),
        )


async def get_queue_url(ctx: Context, body: Body) -> Body:
    name = _string(body, "QueueName")
    assert name is not None
    await _queue(ctx, name)
    return {"QueueUrl": queue_url(ctx.base_url, name)}


async def list_queues(ctx: Context, body: Body) -> Body:
    prefix = _string(body, "QueueNamePrefix", required=False) or ""
    limit = _integer(body, "MaxResults", 1, 1000, None)
    after = _string(body, "NextToken", required=False) or ""
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            sq.LIST_QUEUES.text,
            *sq.LIST_QUEUES.args(prefix=prefix, after=after, limit=(limit or 1000) + 1, scope=ctx.grant.like),
        )
    names = [r["name"] for r in rows]
    out: Body = {"QueueUrls": [queue_url(ctx.base_url, n) for n in names[: limit or 1000]]}
    if limit is not None and len(names) > limit:
        out["NextToken"] = names[limit - 1]
    return out


async def delete_queue(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    async with ctx.db.acquire() as conn, conn.transaction():
        # Two statements: the delete's snapshot must be taken once the lock is held (sq.LOCK_QUEUE).
        await conn.execute(sq.LOCK_QUEUE.text, *sq.LOCK_QUEUE.args(queue=name))
        gone = await conn.fetchval(sq.DELETE_QUEUE.text, *sq.DELETE_QUEUE.args(queue=name))
    if gone is None:
        raise queue_does_not_exist(name)
    return {}


async def purge_queue(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    await _queue(ctx, name)
    async with ctx.db.acquire() as conn:
        await conn.execute(sq.PURGE.text, *sq.PURGE.args(queue=name))
    return {}


async def get_queue_attributes(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    wanted = body.get("AttributeNames") or []
    if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
        raise invalid_parameter("AttributeNames must be a list of attribute names.")
    row = await _queue(ctx, name)
    stats = await jobs.queue(ctx.db, name)
    everything = queue_attributes(row, stats)
    from app.sqs.attributes import COMPUTED, SETTABLE

    for w in wanted:
        if w not in COMPUTED and w not in SETTABLE:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    if "All" in wanted:
        return {"Attributes": everything}
    return {"Attributes": {w: everything[w] for w in wanted if w in everything}}


async def set_queue_attributes(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    if body.get("Attributes") is None:
        raise missing_parameter("Attributes")
    keep, settings = check_queue_attributes(body.get("Attributes"))
    await _queue(ctx, name)
    await _configure(ctx, name, keep, settings)
    return {}


async def list_dead_letter_source_queues(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    await _queue(ctx, name)
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            sq.DEAD_LETTER_SOURCES.text, *sq.DEAD_LETTER_SOURCES.args(arn=queue_arn(name))
        )
    names = [r["name"] for r in rows if ctx.grant.admits(r["name"])]
    return {"queueUrls": [queue_url(ctx.base_url, name) for name in names]}


# --- messages --------------------------------------------------------------------------------------


@dataclass
class _Outgoing:
    entry_id: str | None
    body: str
    delay: int | None
    attributes: dict[str, dict[str, str]]


def _outgoing(entry: Body, max_bytes: int, entry_id: str | None = None) -> _Outgoing:
    text = _string(entry, "MessageBody")
    assert text is not None
    if not text:
        raise missing_parameter("MessageBody")
    check_message_text(text, "the message body")
    attributes = check_message_attributes(entry.get("MessageAttributes"))
    size = len(text.encode()) + sum(
        len(n.encode())
        + len(a["DataType"].encode())
        + len((a.get("StringValue") or a["BinaryValue"]).encode())
        for n, a in attributes.items()
    )
    if size > max_bytes:
        raise invalid_parameter(
            f"One or more parameters are invalid. Reason: Message must be shorter than {max_bytes} bytes."
        )
    delay = _integer(entry, "DelaySeconds", 0, 900, None)
    return _Outgoing(entry_id, text, delay, attributes)


def _max_message_bytes(ctx: Context, row: asyncpg.Record) -> int:
    return min(int(_kept(row).get("MaximumMessageSize", 262144)), ctx.db.settings.max_payload_bytes)


async def _send(ctx: Context, name: str, row: asyncpg.Record, messages: list[_Outgoing]) -> list[Body]:
    default_delay = int(_kept(row).get("DelaySeconds", 0))
    requests = [
        EnqueueRequest(
            queue=name, payload=m.body, delay=float(m.delay if m.delay is not None else default_delay)
        )
        for m in messages
    ]
    with_attributes = [k for k, m in enumerate(messages) if m.attributes]

    async def store_attributes(conn: asyncpg.Connection, rows: list[dict[str, Any]]) -> None:
        await conn.execute(
            sq.SET_MESSAGE_ATTRIBUTES.text,
            *sq.SET_MESSAGE_ATTRIBUTES.args(
                ids=[rows[k]["id"] for k in with_attributes],
                attributes=[json.dumps(messages[k].attributes) for k in with_attributes],
            ),
        )

    if len(requests) == 1 and not with_attributes:
        rows = [await jobs.enqueue_one(ctx.db, requests[0])]
    else:
        rows = await jobs.enqueue(ctx.db, requests, then=store_attributes if with_attributes else None)
    out = []
    for m, job in zip(messages, rows, strict=True):
        sent: Body = {"MessageId": str(job["id"]), "MD5OfMessageBody": md5_of_body(m.body)}
        if m.attributes:
            sent["MD5OfMessageAttributes"] = md5_of_attributes(m.attributes)
        out.append(sent)
    return out


async def send_message(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    row = await _queue(ctx, name)
    message = _outgoing(body, _max_message_bytes(ctx, row))
    (sent,) = await _send(ctx, name, row, [message])
    return sent


async def send_message_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    entries = _entries(body, "Entries")
    row = await _queue(ctx, name)
    limit = _max_message_bytes(ctx, row)
    good: list[_Outgoing] = []
    failed = []
    for entry in entries:
        try:
            good.append(_outgoing(entry, limit, entry["Id"]))
        except SqsError as error:
            failed.append(_failed(entry["Id"], error))
    successful = []
    if good:
        for m, sent in zip(good, await _send(ctx, name, row, good), strict=True):
            successful.append({"Id": m.entry_id, **sent})
    return {"Successful": successful, "Failed": failed}


def _body_of(payload: Any) -> str:
    """The message body of a job: the payload itself when it is a JSON string, else its JSON text."""
    text = orjson.dumps(payload).decode()
    if text.startswith('"'):
        return orjson.loads(text)
    return text


def _system_names(body: Body) -> set[str]:
    names: set[str] = set()
    for key in ("AttributeNames", "MessageSystemAttributeNames"):
        value = body.get(key) or []
        if not isinstance(value, list):
            raise invalid_parameter(f"{key} must be a list.")
        names.update(v for v in value if isinstance(v, str))
    return names


def _millis(value: Any) -> str:
    return str(int(value.timestamp() * 1000))


async def receive_message(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    count = _integer(body, "MaxNumberOfMessages", 1, 10, 1)
    visibility = _integer(body, "VisibilityTimeout", 0, 43200, None)
    wait = _integer(body, "WaitTimeSeconds", 0, 20, None)
    system = _system_names(body)
    row = await _queue(ctx, name)
    if wait is None:
        wait = int(_kept(row).get("ReceiveMessageWaitTimeSeconds", 0))
    leased = await jobs.lease(
        ctx.db,
        ctx.wakeups,
        queue=name,
        max_jobs=count or 1,
        visibility_timeout=float(visibility) if visibility is not None else None,
        wait=float(wait),
        worker_id="sqs",
        disconnected=ctx.disconnected,
    )
    if not leased:
        return {"Messages": []}
    async with ctx.db.acquire() as conn:
        extras = {
            r["id"]: r
            for r in await conn.fetch(sq.RECEIVED.text, *sq.RECEIVED.args(ids=[j["id"] for j in leased]))
        }
    everything = "All" in system
    messages = []
    for job in leased:
        extra = extras.get(job["id"])
        text = _body_of(job["payload"])
        message: Body = {
            "MessageId": str(job["id"]),
            "ReceiptHandle": receipt_handle(job["id"], job["lease_token"]),
            "MD5OfBody": md5_of_body(text),
            "Body": text,
        }
        attributes = {
            "ApproximateReceiveCount": str(job["attempts"]),
            "SentTimestamp": _millis(job["created_at"]),
            "ApproximateFirstReceiveTimestamp": _millis(
                extra["first_received_at"] if extra and extra["first_received_at"] else job["run_at"]
            ),
            "SenderId": "jobq",
        }
        chosen = {k: v for k, v in attributes.items() if everything or k in system}
        if chosen:
            message["Attributes"] = chosen
        stored = extra["message_attributes"] if extra else None
        if isinstance(stored, str):
            stored = json.loads(stored)
        selected = select_message_attributes(stored, body.get("MessageAttributeNames"))
        if selected:
            message["MessageAttributes"] = selected
            message["MD5OfMessageAttributes"] = md5_of_attributes(selected)
        messages.append(message)
    return {"Messages": messages}


def _handle(value: Any) -> tuple[int, str]:
    if value is None:
        raise missing_parameter("ReceiptHandle")
    return parse_receipt_handle(value)


def _stale(handle: str) -> SqsError:
    return receipt_handle_invalid(
        f'The receipt handle "{handle}" is no longer valid: the message was received again or deleted.'
    )


async def delete_message(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    job_id, token = _handle(body.get("ReceiptHandle"))
    (result,) = await jobs.ack(ctx.db, [AckRequest(id=job_id, lease_token=token)])
    # An unknown job was deleted already (or purged): deleting twice succeeds, as in SQS.
    if not result["ok"] and result["code"] == "lease_lost":
        raise _stale(body["ReceiptHandle"])
    return {}


async def delete_message_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    entries = _entries(body, "Entries")
    items: list[tuple[str, AckRequest]] = []
    failed = []
    for entry in entries:
        try:
            job_id, token = _handle(entry.get("ReceiptHandle"))
            items.append((entry["Id"], AckRequest(id=job_id, lease_token=token)))
        except SqsError as error:
            failed.append(_failed(entry["Id"], error))
    successful = []
    if items:
        results = await jobs.ack(ctx.db, [item for _, item in items])
        for (entry_id, _), result in zip(items, results, strict=True):
            if not result["ok"] and result["code"] == "lease_lost":
                failed.append(
                    _failed(
                        entry_id, _stale(next(e for e in entries if e["Id"] == entry_id)["ReceiptHandle"])
                    )
                )
            else:
                successful.append({"Id": entry_id})
    return {"Successful": successful, "Failed": failed}


def _not_in_flight() -> SqsError:
    return SqsError(
        "MessageNotInflight",
        "The message referred to isn't in flight under this receipt handle.",
        query_code="AWS.SimpleQueueService.MessageNotInflight",
    )


async def _change_visibility(ctx: Context, handle: Any, timeout: Any) -> None:
    job_id, token = _handle(handle)
    if timeout is None:
        raise missing_parameter("VisibilityTimeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout <= 43200:
        raise invalid_parameter(
            f"Value {timeout} for parameter VisibilityTimeout is invalid. "
            "Reason: must be between 0 and 43200."
        )
    if timeout > 0:
        try:
            await jobs.extend(ctx.db, job_id, token, float(timeout))
        except NotFound as exc:
            raise receipt_handle_invalid() from exc
        except LeaseLost as exc:
            raise _not_in_flight() from exc
        return
    # Visible again now: the lease ends like a nack that retries at once (the receive still counts).
    (result,) = await jobs.nack(ctx.db, [NackRequest(id=job_id, lease_token=token, retry_after=0.0)])
    if not result["ok"]:
        raise receipt_handle_invalid() if result["code"] == "not_found" else _not_in_flight()


async def change_message_visibility(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    await _change_visibility(ctx, body.get("ReceiptHandle"), body.get("VisibilityTimeout"))
    return {}


async def change_message_visibility_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    successful, failed = [], []
    for entry in _entries(body, "Entries"):
        try:
            await _change_visibility(ctx, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout"))
            successful.append({"Id": entry["Id"]})
        except SqsError as error:
            failed.append(_failed(entry["Id"], error))
    return {"Successful": successful, "Failed": failed}


# --- dead-letter redrive ---------------------------------------------------------------------------


async def _redrive_sources(ctx: Context, source_arn: str) -> list[str]:
    """The queues whose dead jobs a move task from `source_arn` moves back: those whose RedrivePolicy
    names it as their dead-letter queue, or else the queue the ARN names itself (its own dead jobs)."""
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(sq.DEAD_LETTER_SOURCES.text, *sq.DEAD_LETTER_SOURCES.args(arn=source_arn))
    if rows:
        return [r["name"] for r in rows]
    name = name_from_arn(source_arn, "SourceArn")
    await _queue(ctx, name)
    return [name]


async def start_message_move_task(ctx: Context, body: Body) -> Body:
    source_arn = _string(body, "SourceArn")
    assert source_arn is not None
    destination_arn = _string(body, "DestinationArn", required=False)
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
    source_arn = _string(body, "SourceArn")
    limit = _integer(body, "MaxResults", 1, 10, 1)
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


ACTIONS: dict[str, Callable[[Context, Body], Awaitable[Body]]] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
}

# Errors of pydantic models built from SQS input (ids out of range and the like) are the caller's.
INPUT_ERRORS = (ValidationError,)
