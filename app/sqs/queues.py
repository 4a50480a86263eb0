"""The SQS queue actions: a queue is a jobq queue (of the same name in the default region:
app/sqs/regions.py), its settings jobq's where jobq has them (app/sqs/attributes.py) and kept as given
where not (app/service/sqs_queues.py)."""

from __future__ import annotations

import json
from typing import Any

from app import service
from app.db.sql import sqs as sq
from app.db.sql.fragments import DEAD_LETTER_KEY
from app.http.middleware.access_log import note
from app.service import redrive, sqs_messages, sqs_queues
from app.sqs import auth
from app.sqs.attributes import (
    BOOLEAN,
    COMPUTED,
    FIFO,
    NO_REDRIVE_MAX_ATTEMPTS,
    SETTABLE,
    check_queue_attributes,
    queue_attributes,
    shown_policy,
)
from app.sqs.context import Context, kept_attributes, queue_row
from app.sqs.fifo import fifo_of
from app.sqs.params import Body, integer, string
from app.sqs.protocol import (
    FIFO_QUEUE_NAME,
    SQS_QUEUE_NAME,
    SqsError,
    invalid_parameter,
    missing_parameter,
    queue_does_not_exist,
)
from app.sqs.tags import check_tags


async def create_queue(ctx: Context, body: Body) -> Body:
    sqs_name = string(body, "QueueName")
    assert sqs_name is not None
    given = body.get("Attributes")
    fifo = _fifo_asked(given)
    if fifo:
        if not FIFO_QUEUE_NAME.match(sqs_name):
            raise invalid_parameter(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                "underscores, must end with .fifo suffix and be 1 to 80 in length."
            )
    elif not SQS_QUEUE_NAME.match(sqs_name):
        # A .fifo name without FifoQueue=true is refused as SQS refuses it.
        raise invalid_parameter(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    keep, settings = check_queue_attributes(given, fifo=fifo)
    _note_dead_letter_queue(ctx, keep)
    tags = check_tags(body["tags"], "tags") if body.get("tags") is not None else {}
    name = ctx.named(sqs_name)
    existing = await sqs_queues.find_queue(ctx.runtime.db, name)
    if existing is not None:
        # Creating an existing queue is fine when it asks for nothing different.
        shown = queue_attributes(existing, ctx.arn(name), {"pending": 0, "running": 0, "scheduled": 0})
        for attribute, value in (given or {}).items():
            mine = shown.get(attribute)
            if attribute == "FifoQueue":
                same = (mine or "false") == ("true" if fifo else "false")
            elif attribute in BOOLEAN:
                same = mine == value.lower()
            elif attribute == "RedrivePolicy" and value:
                same = mine is not None and json.loads(mine) == shown_policy(keep[attribute])
            else:
                same = mine == value
            if not same:
                raise SqsError(
                    "QueueNameExists",
                    "A queue already exists with the same name and a different value for attribute "
                    f"{attribute}",
                    query_code="QueueAlreadyExists",
                )
        return {"QueueUrl": ctx.url(name)}
    if await sqs_queues.deleted_recently(ctx.runtime.db, name):
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
    await sqs_queues.configure(ctx.runtime, name, keep, service.QueueSettings(**settings))
    if tags:  # an existing queue keeps its own, as in SQS
        await sqs_queues.set_tags(ctx.runtime.db, name, tags)
    return {"QueueUrl": ctx.url(name)}


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


def _note_dead_letter_queue(ctx: Context, keep: dict[str, str]) -> None:
    """Note in the RedrivePolicy that `keep` sets the jobq queue its ARN names (app/db/sql/fragments.py
    DEAD_LETTER_KEY), which must be in the request's region, as in SQS; AccessDenied, nothing changed,
    when that queue is outside the key's queues (scoped admins' too). The move into it runs inside jobq,
    under no key, whoever received the message: so the check is here, where the policy is set, and a
    policy set by a key that may use its dead-letter queue stays in force for every key that receives
    from the queue. RedriveAllowPolicy's sourceQueueArns and Policy name queues too, but jobq keeps them
    without effect: they reach no queue, and are not checked."""
    policy = keep.get("RedrivePolicy")
    if not policy:
        return
    given = json.loads(policy)
    target = ctx.of_arn(given["deadLetterTargetArn"], "deadLetterTargetArn")
    auth.admit_queue(ctx.grant, target)
    keep["RedrivePolicy"] = json.dumps({**given, DEAD_LETTER_KEY: target})


async def get_queue_url(ctx: Context, body: Body) -> Body:
    given = string(body, "QueueName")
    assert given is not None
    name = ctx.named(given)
    await queue_row(ctx, name)
    return {"QueueUrl": ctx.url(name)}


async def list_queues(ctx: Context, body: Body) -> Body:
    prefix = string(body, "QueueNamePrefix", required=False) or ""
    limit = integer(body, "MaxResults", 1, 1000, None)
    after = string(body, "NextToken", required=False) or ""
    within, others = ctx.regions.prefix(ctx.region)
    names = await sqs_queues.list_queues(
        ctx.runtime.db, within + prefix, after, (limit or 1000) + 1, ctx.grant.like, others
    )
    # No match: no QueueUrls at all, as SQS answers (not an empty list).
    out: Body = {"QueueUrls": [ctx.url(n) for n in names[: limit or 1000]]} if names else {}
    if limit is not None and len(names) > limit:
        out["NextToken"] = names[limit - 1]
    return out


async def delete_queue(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    note(queue=name)
    if not await sqs_queues.delete_queue(ctx.runtime.db, name):
        raise queue_does_not_exist(name)
    return {}


async def purge_queue(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    row = await queue_row(ctx, name)
    fifo = fifo_of(kept_attributes(row)) is not None
    if not await sqs_queues.purge_queue(ctx.runtime.db, name, fifo=fifo):
        raise SqsError(
            "PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {name} is allowed every {sq.SQS_NAME_HOLD} seconds.",
            status=403,
            query_code="AWS.SimpleQueueService.PurgeQueueInProgress",
        )
    return {}


async def get_queue_attributes(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    wanted = body.get("AttributeNames") or []
    if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
        raise invalid_parameter("AttributeNames must be a list of attribute names.")
    row = await queue_row(ctx, name)
    stats = await sqs_messages.counts(ctx.runtime.db, name)
    everything = queue_attributes(row, ctx.arn(name), stats)
    for w in wanted:
        # A standard queue has no FIFO attributes: asking for one by name is an error, as in SQS.
        if (w not in COMPUTED and w not in SETTABLE) or (w in FIFO and w not in everything):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    if "All" in wanted:
        return {"Attributes": everything}
    return {"Attributes": {w: everything[w] for w in wanted if w in everything}}


async def set_queue_attributes(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    if body.get("Attributes") is None:
        raise missing_parameter("Attributes")
    row = await queue_row(ctx, name)
    kept = kept_attributes(row)
    keep, settings = check_queue_attributes(
        body.get("Attributes"), fifo=kept.get("FifoQueue") == "true", current=kept
    )
    _note_dead_letter_queue(ctx, keep)
    await sqs_queues.configure(ctx.runtime, name, keep, service.QueueSettings(**settings))
    return {}


async def list_dead_letter_source_queues(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    await queue_row(ctx, name)
    sources = await redrive.dead_letter_sources(ctx.runtime.db, name)
    names = [source for source in sources if ctx.grant.admits(source)]
    return {"queueUrls": [ctx.url(name) for name in names]}
