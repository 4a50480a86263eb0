"""SQS FIFO queues, on what jobq has already: keyed flow control, idempotency keys, job ids.

A FIFO queue (a `.fifo` name created with ``FifoQueue`` "true") is a jobq queue whose ``key_concurrency`` is
1, set through the queue's own settings when it is created (sql.CONFIGURE_FLOW, SET_FLOW), and whose
messages carry their ``MessageGroupId`` as the job's key. So the claim itself (sql.LEASE_FLOW) gives
SQS's guarantees, across every replica: a group's messages are received in the order they were sent
(priority, run_at, id: the order of their ids, since a FIFO message has no delay of its own), one
receive's worth at a time (up to MaxNumberOfMessages of a group in one receive, `per_key` of the lease,
the group held until each has ended), and a message that was received and not deleted (its visibility
ran out, or was set to 0) holds its group until it is received again; once it is dead (maxReceiveCount
receives), the group goes on without it. Its attributes (ContentBasedDeduplication, DeduplicationScope,
FifoThroughputLimit) are kept with the queue's other SQS attributes (app/sqs/attributes.py).

Deduplication. A FIFO message's ``MessageDeduplicationId`` (or, with ContentBasedDeduplication, the hex
SHA-256 of its body) makes a send carried out once per five minutes (within its group, with
DeduplicationScope messageGroup): a repeat inserts nothing and answers the first message's MessageId and
SequenceNumber. How, with jobq's idempotency keys: app/service/sqs_fifo.py, with the receive attempts
(``ReceiveRequestAttemptId``) a FIFO receive may be retried under.

Sequence numbers. A FIFO message's SequenceNumber is its job id plus 10^19: twenty digits, as SQS's
look, strictly increasing in the order messages are inserted, per queue and per group, since ids come from
one sequence (an identity column, cache 1: every session draws the next value) and a batch's ids ascend in
its order. Two sends racing each other get ids in the order they drew them, which may differ from the
order they commit in; a group's order is the order of its ids (and of their sends' transaction starts),
so it is the order SequenceNumber shows.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from app.sqs.protocol import SqsError, invalid_parameter

# Added to a job id to make its SequenceNumber (twenty digits, as SQS's).
SEQUENCE_BASE = 10**19

# MessageGroupId, MessageDeduplicationId, ReceiveRequestAttemptId: 1-128 letters, digits, punctuation.
TOKEN = re.compile(r"[A-Za-z0-9!-/:-@\[-`{-~]{1,128}")


def check_token(value: str, parameter: str) -> str:
    if not TOKEN.fullmatch(value):
        raise invalid_parameter(
            f"Value for parameter {parameter} is invalid. Reason: it must be 1 to 128 letters, digits or "
            "punctuation marks."
        )
    return value


@dataclass(frozen=True, slots=True)
class Fifo:
    """A FIFO queue's settings, as its attributes say."""

    content_based: bool  # ContentBasedDeduplication: the body's SHA-256 when no id is given
    per_group: bool  # DeduplicationScope messageGroup: ids are deduplicated within a group only


def fifo_of(kept: dict[str, str]) -> Fifo | None:
    """The queue's FIFO settings from its kept attributes; None for a standard queue."""
    if kept.get("FifoQueue") != "true":
        return None
    return Fifo(
        content_based=kept.get("ContentBasedDeduplication") == "true",
        per_group=kept.get("DeduplicationScope") == "messageGroup",
    )


def sequence_number(job_id: int) -> str:
    return str(SEQUENCE_BASE + job_id)


def no_deduplication_id() -> SqsError:
    """SQS's answer to a FIFO message with no MessageDeduplicationId on a queue without content-based
    deduplication, a SendMessage's or a whole SendMessageBatch's."""
    return invalid_parameter(
        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
        "provided explicitly"
    )


def deduplication_id(fifo: Fifo, given: str | None, body: str) -> str:
    """The message's deduplication id: the one given, or the SHA-256 of its body with content-based
    deduplication; else InvalidParameterValue, as SQS answers."""
    if given is not None:
        return check_token(given, "MessageDeduplicationId")
    if fifo.content_based:
        return hashlib.sha256(body.encode()).hexdigest()
    raise no_deduplication_id()


def check_batch(entries: list[dict[str, Any]], fifo: Fifo) -> None:
    """Refuse a FIFO SendMessageBatch whole, as SQS does (an error of the request, not failures of its
    entries, and nothing sent), when an entry has no MessageGroupId, or no MessageDeduplicationId while
    the queue has no content-based deduplication. SQS answers a batch's missing group with
    InvalidParameterValue, where a SendMessage's is MissingParameter."""
    for entry in entries:
        if entry.get("MessageGroupId") is None:
            raise invalid_parameter("The request must contain the parameter MessageGroupId.")
        if entry.get("MessageDeduplicationId") is None and not fifo.content_based:
            raise no_deduplication_id()
