"""The SQS message actions, each one of jobq's own operations: SendMessage enqueues, ReceiveMessage
leases (with the same long-poll and wake-ups), DeleteMessage acks and ChangeMessageVisibility extends
(or, to 0, nacks for a retry at once), each under the lease token the receipt handle carries. So jobq's
fencing holds: a handle from an earlier receive deletes nothing once the message was received again
(ReceiptHandleIsInvalid). A handle is valid on the queue whose receive handed it out only, as in SQS:
the queue its lease token names must be the one the request is for, else ReceiptHandleIsInvalid.

The payload is the body: a message's body is stored as a JSON string, so jobq's API, CLI and workers
see exactly the text that was sent; a job enqueued through jobq's API with any other JSON payload is
received through SQS with that JSON text as its body. Its trace context is the job's traceparent
(app/sqs/trace_context.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from app import service
from app.core.errors import Invalid, LeaseLost, NotFound
from app.core.limits import MAX_LEASE_TOKEN
from app.core.states import FINISHED
from app.core.tokens import parse_token
from app.http.middleware.access_log import note
from app.service import sqs_fifo, sqs_messages
from app.service.rows import Row
from app.sqs import fifo as fifo_queues
from app.sqs.attributes import (
    MAX_MESSAGE_BYTES,
    check_message_attributes,
    check_message_text,
    select_message_attributes,
)
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
    name_from_url,
    parse_receipt_handle,
    receipt_handle,
    receipt_handle_invalid,
)
from app.sqs.trace_context import TRACE_HEADER, SentTrace, sent_trace, trace_header

# A receipt handle may carry a spelling of a UUID longer than MAX_LEASE_TOKEN (uuid.UUID ignores any
# number of hyphens); DeleteMessage and a visibility of 0 refuse it as the API would, for the whole request.


# --- sending ---------------------------------------------------------------------------------------


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
        # A FIFO message: in a group, deduplicated, and delayed only by the queue's DelaySeconds.
        if group is None:
            raise missing_parameter("MessageGroupId")
        if delay is not None:
            raise _not_for_this_queue("DelaySeconds", delay)
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
    name = name_from_url(body.get("QueueUrl"))
    row = await queue_row(ctx, name)
    message = _outgoing(
        body, _max_message_bytes(ctx, row), fifo_of(kept_attributes(row)), trace=ctx.trace_header
    )
    (sent,) = await _send(ctx, name, row, [message])
    return sent


async def send_message_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    given = entries(body, "Entries")
    row = await queue_row(ctx, name)
    limit = _max_message_bytes(ctx, row)
    fifo = fifo_of(kept_attributes(row))
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


# --- receiving -------------------------------------------------------------------------------------


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


async def _take(
    ctx: Context, name: str, count: int, timeout: float | None, wait: float, attempt: str | None
) -> list[Row]:
    """Lease up to `count` messages for a receive; with a ReceiveRequestAttemptId (FIFO queues), what
    that attempt received before, if still in flight."""
    leased = []
    if attempt is not None:  # the same attempt again: what it received, if still in flight
        leased = await sqs_fifo.replay_receive(ctx.runtime.db, name, attempt, timeout)
    if not leased:
        leased = await service.lease(
            ctx.runtime,
            queue=name,
            max_jobs=count,
            visibility_timeout=timeout,
            wait=wait,
            worker_id="sqs",
            disconnected=ctx.disconnected,
        )
        if attempt is not None:
            if not leased:
                # Nothing free: perhaps a receive with this attempt id took it meanwhile.
                leased = await sqs_fifo.replay_receive(ctx.runtime.db, name, attempt, timeout)
            elif not await sqs_fifo.keep_receive(ctx.runtime.db, name, attempt, leased):
                # Another receive with this attempt id got in first: its messages are the answer.
                await sqs_fifo.hand_back(ctx.runtime.db, leased)
                leased = await sqs_fifo.replay_receive(ctx.runtime.db, name, attempt, timeout)
    return leased


async def _drop_expired(ctx: Context, leased: list[Row], retention: int) -> list[Row]:
    """The leased messages still within `retention` seconds of being sent; the others deleted."""
    gone = await sqs_messages.expire_messages(ctx.runtime.db, leased, float(retention))
    return [j for j in leased if j["id"] not in gone]


async def receive_message(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    count = integer(body, "MaxNumberOfMessages", 1, 10, 1)
    visibility = integer(body, "VisibilityTimeout", 0, 43200, None)
    wait = integer(body, "WaitTimeSeconds", 0, 20, None)
    attempt = string(body, "ReceiveRequestAttemptId", required=False)
    if attempt is not None:
        fifo_queues.check_token(attempt, "ReceiveRequestAttemptId")
    system = _system_names(body)
    row = await queue_row(ctx, name)
    kept = kept_attributes(row)
    fifo = fifo_of(kept)
    if fifo is None:
        attempt = None  # SQS honours it on FIFO queues only
    if wait is None:
        wait = int(kept.get("ReceiveMessageWaitTimeSeconds", 0))
    if visibility is None and kept.get("VisibilityTimeout") == "0":
        visibility = 0
    timeout = float(visibility) if visibility is not None else None
    retention = kept.get("MessageRetentionPeriod")
    deadline = time.monotonic() + wait
    while True:
        left = max(0.0, deadline - time.monotonic())
        leased = await _take(ctx, name, count or 1, timeout, left, attempt)
        if retention is None or not leased:
            break
        # Messages past the queue's MessageRetentionPeriod are deleted, as SQS deletes them, when a
        # receive meets them (this costs a statement per receive of such a queue only); if that took
        # every one, the receive goes on, within its wait.
        leased = await _drop_expired(ctx, leased, int(retention))
        if leased or time.monotonic() >= deadline:
            break
    note(jobs=len(leased))
    if not leased:
        return {"Messages": []}
    if visibility == 0:
        # Visible again at once, as in SQS: the leases, already past their deadline, are expired now
        # rather than by the next sweep, each receive counted (and a message out of receives dead). The
        # receipt handle still deletes the message until another receive takes it.
        await service.expire_leases(ctx.runtime)
    extras = await sqs_messages.received(ctx.runtime.db, [j["id"] for j in leased])
    everything = "All" in system
    messages = []
    for job in leased:
        extra = extras.get(job["id"])
        text = _body_of(job["payload"])
        message: Body = {
            "MessageId": message_id(job["id"]),
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
        if job["key"] is not None:
            attributes["MessageGroupId"] = job["key"]
        if job["traceparent"] is not None:
            attributes[TRACE_HEADER] = trace_header(job["traceparent"])
        if fifo is not None:
            attributes["SequenceNumber"] = sequence_number(job["id"])
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


# --- deleting and changing visibility --------------------------------------------------------------


def _handle(value: Any, queue: str) -> tuple[int, str, bool]:
    """The job id and lease token a receipt handle carries, and whether the token is a bare UUID, as
    jobq spelled them before they named their queue (``_elsewhere`` checks those). ReceiptHandleIsInvalid,
    as SQS answers, when the token names a queue other than `queue`, the one the request is for."""
    if value is None:
        raise missing_parameter("ReceiptHandle")
    job_id, token = parse_receipt_handle(value)
    named = parse_token(token)[1]
    if named is not None and named != queue:
        raise _of_another_queue(value)
    return job_id, token, named is None


async def _elsewhere(ctx: Context, queue: str, ids: list[int]) -> set[int]:
    """Those of the jobs `ids` (of receipt handles with a bare token) that are not in `queue`, looked up
    in one statement; a handle of today's receives names its queue and needs no query."""
    return await sqs_messages.elsewhere(ctx.runtime.db, queue, ids)


def _of_another_queue(handle: str) -> SqsError:
    return receipt_handle_invalid(
        f'The receipt handle "{handle}" is not valid for this queue: another queue\'s receive handed it out.'
    )


def _checked_token(token: str) -> str:
    """`token`, unless it is longer than jobq's API takes one: then Invalid (a refusal of the whole
    request, not of one batch entry)."""
    if len(token) > MAX_LEASE_TOKEN:
        raise Invalid(f"The receipt handle's lease token is longer than {MAX_LEASE_TOKEN} characters.")
    return token


def _stale(handle: str) -> SqsError:
    return receipt_handle_invalid(
        f'The receipt handle "{handle}" is no longer valid: the message was received again or deleted.'
    )


async def delete_message(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    job_id, token, bare = _handle(body.get("ReceiptHandle"), name)
    if bare and await _elsewhere(ctx, name, [job_id]):
        raise _of_another_queue(body["ReceiptHandle"])
    (result,) = await service.ack_batch(ctx.runtime, [service.JobLease(job_id, _checked_token(token))])
    # An unknown job was deleted already (or purged): deleting twice succeeds, as in SQS.
    if not result["ok"] and result["code"] == "lease_lost":
        raise _stale(body["ReceiptHandle"])
    return {}


async def delete_message_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    given = entries(body, "Entries")
    items: list[tuple[str, service.JobLease]] = []
    refused = []
    bare = []  # entries whose job's queue is still to be checked (_elsewhere)
    for entry in given:
        try:
            job_id, token, unnamed = _handle(entry.get("ReceiptHandle"), name)
            items.append((entry["Id"], service.JobLease(job_id, _checked_token(token))))
        except SqsError as error:
            refused.append(failed(entry["Id"], error))
            continue
        if unnamed:
            bare.append(job_id)
    elsewhere = await _elsewhere(ctx, name, bare) if bare else set()
    if elsewhere:
        handles = {e["Id"]: e["ReceiptHandle"] for e in given}
        for entry_id, item in items:
            if item.id in elsewhere:
                refused.append(failed(entry_id, _of_another_queue(handles[entry_id])))
        items = [(entry_id, item) for entry_id, item in items if item.id not in elsewhere]
    successful = []
    if items:
        results = await service.ack_batch(ctx.runtime, [item for _, item in items])
        for (entry_id, _), result in zip(items, results, strict=True):
            if not result["ok"] and result["code"] == "lease_lost":
                refused.append(
                    failed(entry_id, _stale(next(e for e in given if e["Id"] == entry_id)["ReceiptHandle"]))
                )
            else:
                successful.append({"Id": entry_id})
    return {"Successful": successful, "Failed": refused}


def _refusal(handle: str, status: str | None) -> SqsError:
    """Why a visibility change by `handle` changed nothing, given the message's status now (None: gone):
    deleted or otherwise done, or in flight under another receive's handle."""
    return _unavailable(handle) if status is None or status in FINISHED else _not_in_flight()


def _unavailable(handle: str) -> SqsError:
    """A message deleted, or gone otherwise: SQS's answer to changing its visibility."""
    return invalid_parameter(
        f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not"
        " available for visibility timeout change."
    )


def _not_in_flight() -> SqsError:
    return SqsError(
        "MessageNotInflight",
        "The message referred to isn't in flight under this receipt handle.",
        query_code="AWS.SimpleQueueService.MessageNotInflight",
    )


async def _change_visibility(ctx: Context, queue: str, handle: Any, timeout: Any) -> None:
    job_id, token, bare = _handle(handle, queue)
    if timeout is None:
        raise missing_parameter("VisibilityTimeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout <= 43200:
        raise invalid_parameter(
            f"Value {timeout} for parameter VisibilityTimeout is invalid. "
            "Reason: must be between 0 and 43200."
        )
    if bare and await _elsewhere(ctx, queue, [job_id]):
        raise _of_another_queue(handle)
    if timeout > 0:
        try:
            await service.extend(ctx.runtime.db, job_id, token, float(timeout))
        except NotFound as exc:
            raise _unavailable(handle) from exc
        except LeaseLost as exc:
            # Not running under this handle: its visibility may have run out with nobody receiving it
            # since, which SQS lets the handle take back; else it is done, or in another receive's hands.
            revived, status = await sqs_messages.revive(
                ctx.runtime.db, job_id, _checked_token(token), float(timeout)
            )
            if not revived:
                raise _refusal(handle, status) from exc
        return
    # Visible again now: the lease ends like a nack that retries at once (the receive still counts).
    (result,) = await service.nack_batch(
        ctx.runtime, [service.Nack(job_id, _checked_token(token), retry_after=0.0)]
    )
    if not result["ok"]:
        raise _refusal(handle, await sqs_messages.status(ctx.runtime.db, job_id))


async def change_message_visibility(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    await _change_visibility(ctx, name, body.get("ReceiptHandle"), body.get("VisibilityTimeout"))
    return {}


async def change_message_visibility_batch(ctx: Context, body: Body) -> Body:
    name = name_from_url(body.get("QueueUrl"))
    note(queue=name)
    successful, refused = [], []
    for entry in entries(body, "Entries"):
        try:
            await _change_visibility(ctx, name, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout"))
            successful.append({"Id": entry["Id"]})
        except SqsError as error:
            refused.append(failed(entry["Id"], error))
    return {"Successful": successful, "Failed": refused}
