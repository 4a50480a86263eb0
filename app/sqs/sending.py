"""SendMessage and SendMessageBatch: each message is a job, enqueued with jobq's own enqueue (a single plain
message shares its INSERT with concurrent enqueues), its message attributes stored with it, and a FIFO
message sent once per deduplication id (app/sqs/fifo.py).

The payload is the body: a message's body is stored as a JSON string, so jobq's API, CLI and workers
see exactly the text that was sent; a job enqueued through jobq's API with any other JSON payload is
received through SQS with that JSON text as its body (app/sqs/receiving.py). Its trace context is the
job's traceparent (app/sqs/trace_context.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from app import service
from app.service import sqs_fifo, sqs_messages
from app.service.rows import Row
from app.sqs import fifo as fifo_queues
from app.sqs.attributes import MAX_MESSAGE_BYTES, check_message_attributes, check_message_text
from app.sqs.context import Context, kept_attributes, queue_row
from app.sqs.fifo import Fifo, fifo_of, sequence_number
from app.sqs.params import Body, entries, failed, integer, string
from app.sqs.protocol import (
    SqsError,
    invalid_parameter,
    md5_of_attributes,
    md5_of_body,
    message_id,
    missing_parameter,
)
from app.sqs.trace_context import SentTrace, sent_trace


@dataclass
class _Outgoing:
    entry_id: str | None
    body: str
    delay: int | None
    attributes: dict[str, dict[str, str]]
    trace: SentTrace
    group: str | None = None  # MessageGroupId: the job's key (flow control: a fair queue's tenant)
    dedup: str | None = None  # a FIFO message's deduplication id (app/sqs/fifo.py)
    size: int = 0  # bytes as SQS counts them: the body and the attributes


def _not_for_this_queue(parameter: str, value: Any) -> SqsError:
    return invalid_parameter(
        f"Value {value} for parameter {parameter} is invalid. Reason: The request include parameter "
        "that is not valid for this queue type."
    )


def _outgoing(
    entry: Body, max_bytes: int, fifo: Fifo | None, entry_id: str | None = None, trace: str | None = None
) -> _Outgoing:
    """A message to send, checked; `trace` is the request's X-Amzn-Trace-Id header."""
    text = string(entry, "MessageBody")
    assert text is not None
    if not text:
        raise missing_parameter("MessageBody")
    check_message_text(text, "the message body")
    attributes = check_message_attributes(entry.get("MessageAttributes"))
    # System attributes do not count towards the size, as in SQS.
    sent = sent_trace(entry.get("MessageSystemAttributes"), attributes, trace)
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
    delay = integer(entry, "DelaySeconds", 0, 900, None)
    group = string(entry, "MessageGroupId", required=False)
    if group is not None:
        fifo_queues.check_token(group, "MessageGroupId")
    dedup = string(entry, "MessageDeduplicationId", required=False)
    if fifo is None:
        if dedup is not None:
            raise _not_for_this_queue("MessageDeduplicationId", dedup)
    else:
        # A FIFO message: in a group, deduplicated, and delayed only by the queue's DelaySeconds (a
        # DelaySeconds of 0 asks for nothing, and SQS takes it).
        if group is None:
            raise missing_parameter("MessageGroupId")
        if delay:
            raise _not_for_this_queue("DelaySeconds", delay)
        delay = None
        dedup = fifo_queues.deduplication_id(fifo, dedup, text)
    return _Outgoing(entry_id, text, delay, attributes, sent, group, dedup, size)


def _max_message_bytes(ctx: Context, row: asyncpg.Record) -> int:
    """The queue's MaximumMessageSize (default 1 MiB, as SQS's), or JOBQ_SQS_MAX_MESSAGE_BYTES, whichever
    is smaller. jobq's own payload limit (JOBQ_MAX_PAYLOAD_BYTES) is for its API: an SQS message is held
    to SQS's rules."""
    return min(
        int(kept_attributes(row).get("MaximumMessageSize", MAX_MESSAGE_BYTES)),
        ctx.runtime.settings.sqs_max_message_bytes,
    )


def _stored_limit(ctx: Context, row: asyncpg.Record) -> int:
    """The largest payload a message within the size limit makes: its body as a JSON string, two quotes
    more, and where a quote, backslash, tab, newline or carriage return takes two bytes (SQS refuses the
    other control characters)."""
    return 2 * _max_message_bytes(ctx, row) + 2


async def _enqueue(
    ctx: Context,
    name: str,
    row: asyncpg.Record,
    messages: list[_Outgoing],
    keep: sqs_fifo.Keep | None = None,
) -> list[Row]:
    """Insert messages as jobs, with their attributes (and `keep`, if given) in the same transaction."""
    default_delay = int(kept_attributes(row).get("DelaySeconds", 0))
    new = [
        service.NewJob(
            queue=name,
            payload=m.body,
            delay=float(m.delay if m.delay is not None else default_delay),
            key=m.group,
            traceparent=m.trace.traceparent,
            tracestate=m.trace.tracestate,
        )
        for m in messages
    ]
    # A single plain message shares its INSERT with concurrent enqueues, when jobq's payload limit,
    # which those apply, takes it.
    small = len(messages) == 1 and 2 * messages[0].size + 2 <= ctx.runtime.settings.max_payload_bytes
    if small and not messages[0].attributes and keep is None:
        return [await service.enqueue(ctx.runtime, new[0])]
    return await sqs_messages.insert_messages(
        ctx.runtime, new, [m.attributes for m in messages], payload_limit=_stored_limit(ctx, row), keep=keep
    )


async def _send(ctx: Context, name: str, row: asyncpg.Record, messages: list[_Outgoing]) -> list[Body]:
    fifo = fifo_of(kept_attributes(row))
    if fifo is None:
        ids = [job["id"] for job in await _enqueue(ctx, name, row, messages)]
    else:

        async def enqueue(chosen: list[_Outgoing], keep: sqs_fifo.Keep) -> list[Row]:
            return await _enqueue(ctx, name, row, chosen, keep)

        ids = await sqs_fifo.send_once(ctx.runtime.db, name, fifo.per_group, messages, enqueue)
    out = []
    for m, job_id in zip(messages, ids, strict=True):
        sent: Body = {"MessageId": message_id(job_id), "MD5OfMessageBody": md5_of_body(m.body)}
        if m.attributes:
            sent["MD5OfMessageAttributes"] = md5_of_attributes(m.attributes)
        if m.trace.system_attributes:
            sent["MD5OfMessageSystemAttributes"] = md5_of_attributes(m.trace.system_attributes)
        if fifo is not None:
            sent["SequenceNumber"] = sequence_number(job_id)
        out.append(sent)
    return out


async def send_message(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    row = await queue_row(ctx, name)
    message = _outgoing(
        body, _max_message_bytes(ctx, row), fifo_of(kept_attributes(row)), trace=ctx.trace_header
    )
    (sent,) = await _send(ctx, name, row, [message])
    return sent


async def send_message_batch(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    given = entries(body, "Entries")
    row = await queue_row(ctx, name)
    limit = _max_message_bytes(ctx, row)
    fifo = fifo_of(kept_attributes(row))
    if fifo is not None:
        fifo_queues.check_batch(given, fifo)
    good: list[_Outgoing] = []
    refused = []
    for entry in given:
        try:
            good.append(_outgoing(entry, limit, fifo, entry["Id"], ctx.trace_header))
        except SqsError as error:
            refused.append(failed(entry["Id"], error))
    total = sum(m.size for m in good)
    if total > MAX_MESSAGE_BYTES:  # SQS's limit on a batch's messages together, as on one message
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes. You have sent {total} bytes.",
            query_code="AWS.SimpleQueueService.BatchRequestTooLong",
        )
    successful = []
    if good:
        for m, sent in zip(good, await _send(ctx, name, row, good), strict=True):
            successful.append({"Id": m.entry_id, **sent})
    return {"Successful": successful, "Failed": refused}
