"""ReceiveMessage: jobq's lease, with the same long-poll and wake-ups. Each message comes with a receipt
handle that carries its job's id and the lease token the receive took (what it does: app/sqs/receipts.py),
its body as it was sent (app/sqs/sending.py), and the attributes asked for; a receive that got nothing
answers without Messages, as SQS does.

Visibility follows SQS's clock rather than the lease-expiry loop's: a message is visible again the moment
its visibility timeout runs out, and the receive that would take it past maxReceiveCount moves it into the
dead-letter queue instead (``_receive``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from app import service
from app.http.middleware.access_log import note
from app.service import sqs_fifo, sqs_messages
from app.service.rows import Row
from app.sqs import fifo as fifo_queues
from app.sqs.attributes import select_message_attributes
from app.sqs.context import Context, kept_attributes, queue_row
from app.sqs.fifo import fifo_of, sequence_number
from app.sqs.params import Body, integer, string
from app.sqs.protocol import (
    invalid_parameter,
    md5_of_attributes,
    md5_of_body,
    message_id,
    receipt_handle,
)
from app.sqs.trace_context import TRACE_HEADER, trace_header


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
    ctx: Context,
    name: str,
    count: int,
    timeout: float | None,
    wait: float,
    attempt: str | None,
    per_group: int,
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
            per_key=per_group,
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


async def _receive(
    ctx: Context,
    name: str,
    count: int,
    timeout: float | None,
    wait: int,
    attempt: str | None,
    kept: dict[str, str],
    row: Any,
) -> list[Row]:
    """Lease up to `count` messages within `wait` seconds from the queue `name` (its SQS attributes:
    `kept`; its row, with what the receive must do first: `row`), each visible as SQS sees it: a message
    whose visibility timeout has run out is taken at once, and one past maxReceiveCount moves into the
    dead-letter queue instead of being returned (sqs_messages.expire_overdue). A long-poll waits in
    stretches, each ending when the next of the queue's leases runs out, and looks again then: nothing
    else would wake it before the expiry loop's next round. A stretch that ends early with nothing taken
    means the client went away or the service is stopping (service.lease returns early for nothing
    else), and so the receive ends too."""
    dlq, due, retention = row["dead_letter_queue"], row, kept.get("MessageRetentionPeriod")
    # A FIFO receive takes several messages of one group, in order, as SQS hands them out; the group is
    # held until all of them are deleted or visible again.
    per_group = count if fifo_of(kept) is not None else 1
    deadline = time.monotonic() + wait
    while True:
        left = max(0.0, deadline - time.monotonic())
        due_in = await sqs_messages.expire_overdue(ctx.runtime, name, dlq, left, due)
        due = None  # read again when it looks again
        stretch = left if due_in is None else min(left, due_in)
        stretch_end = time.monotonic() + stretch
        taken = await _take(ctx, name, count, timeout, stretch, attempt, per_group)
        leased = taken
        if taken and retention is not None:
            # Messages past the queue's MessageRetentionPeriod are deleted, as SQS deletes them, when a
            # receive meets them (this costs a statement per receive of such a queue only); if that took
            # every one, the receive goes on, within its wait.
            leased = await _drop_expired(ctx, taken, int(retention))
        now = time.monotonic()
        if leased or now >= deadline or (not taken and now < stretch_end):
            return leased


async def receive_message(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    count = integer(body, "MaxNumberOfMessages", 1, 10, 1)
    visibility = integer(body, "VisibilityTimeout", 0, 43200, None)
    wait = integer(body, "WaitTimeSeconds", 0, sqs_messages.MAX_WAIT, None)
    attempt = string(body, "ReceiveRequestAttemptId", required=False)
    if attempt is not None:
        fifo_queues.check_token(attempt, "ReceiveRequestAttemptId")
    system = _system_names(body)
    row = await queue_row(ctx, name, sqs_messages.receiving_queue)
    kept = kept_attributes(row)
    fifo = fifo_of(kept)
    if fifo is None:
        attempt = None  # SQS honours it on FIFO queues only
    if wait is None:
        wait = int(kept.get("ReceiveMessageWaitTimeSeconds", 0))
    if visibility is None and kept.get("VisibilityTimeout") == "0":
        visibility = 0
    timeout = float(visibility) if visibility is not None else None
    leased = await _receive(ctx, name, count or 1, timeout, wait, attempt, kept, row)
    note(jobs=len(leased))
    if not leased:
        return {}  # as SQS answers when nothing was received: no Messages at all, not an empty list
    if visibility == 0:
        # Visible again at once, as in SQS: the leases, already past their deadline, are expired now
        # rather than by the next sweep, each receive counted (and a message out of receives dead). The
        # receipt handle still deletes the message until another receive takes it.
        await service.expire_leases(ctx.runtime, name)
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
