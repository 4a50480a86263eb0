"""SQS's queue tags and permissions: stored with the queue and reported, as SQS keeps them.

Tags (TagQueue, UntagQueue, ListQueueTags, CreateQueue's ``tags``) are the queue's ``sqs_tags``: labels
for the user's own bookkeeping (cost allocation, ownership), which jobq shows and never acts on.

Permissions (AddPermission, RemovePermission) edit the queue's ``Policy`` attribute as SQS does: each
label becomes a statement of the queue's access policy, which GetQueueAttributes shows. jobq stores and
reports the policy but does not enforce it: who may do what is decided by jobq's own keys and tokens
(their roles and queue patterns, app/sqs/auth.py), and jobq has no AWS accounts for a policy to name.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from app.http.middleware.access_log import note
from app.service import sqs_queues
from app.service.sqs_queues import QueueMeta
from app.sqs.context import Context
from app.sqs.params import Body, string
from app.sqs.protocol import (
    invalid_parameter,
    missing_parameter,
    queue_does_not_exist,
)

MAX_TAGS = 50  # per queue, as SQS
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
MAX_LABEL = 80
LABEL = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
AWS_ACCOUNT_ID = re.compile(r"^\d{12}$")
# What a permission may grant: SQS's actions that act on a queue, or all of them. Granting SendMessage,
# DeleteMessage or ChangeMessageVisibility grants their batch forms too, as in SQS.
GRANTABLE = {
    "*",
    "ChangeMessageVisibility",
    "DeleteMessage",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "PurgeQueue",
    "ReceiveMessage",
    "SendMessage",
    "StartMessageMoveTask",
    "CancelMessageMoveTask",
    "ListMessageMoveTasks",
}


def check_tags(tags: Any, parameter: str = "Tags") -> dict[str, str]:
    """Tags as SQS takes them: an object of up to MAX_TAGS keys (1-128 characters, not starting with
    ``aws:``, which AWS reserves) to values (0-256 characters)."""
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise invalid_parameter(f"{parameter} must be a map of tag keys to string values.")
    for key, value in tags.items():
        if not 1 <= len(key) <= MAX_TAG_KEY:
            raise invalid_parameter(f"Tag keys must be between 1 and {MAX_TAG_KEY} characters in length.")
        if key.lower().startswith("aws:"):
            raise invalid_parameter(f"Tag key {key} is invalid: the aws: prefix is reserved for AWS use.")
        if len(value) > MAX_TAG_VALUE:
            raise invalid_parameter(f"Tag values may not be longer than {MAX_TAG_VALUE} characters.")
    return tags


async def tag_queue(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    if body.get("Tags") is None:
        raise missing_parameter("Tags")
    added = check_tags(body["Tags"])
    async with _queue_meta(ctx, name) as meta:
        tags = {**meta.tags, **added}
        if len(tags) > MAX_TAGS:
            raise invalid_parameter(f"Too many tags added for queue {name}: a queue has at most {MAX_TAGS}.")
        await meta.set_tags(tags)
    return {}


async def untag_queue(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    keys = body.get("TagKeys")
    if keys is None:
        raise missing_parameter("TagKeys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise invalid_parameter("TagKeys must be a list of tag keys.")
    async with _queue_meta(ctx, name) as meta:
        await meta.set_tags({k: v for k, v in meta.tags.items() if k not in keys})
    return {}


async def list_queue_tags(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    note(queue=name)
    tags = await sqs_queues.queue_tags(ctx.runtime.db, name)
    if tags is None:
        raise queue_does_not_exist(name)
    return {"Tags": tags} if tags else {}


async def add_permission(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    label = _label(body)
    accounts = _names(body, "AWSAccountIds")
    for account in accounts:
        if not AWS_ACCOUNT_ID.match(account):
            raise invalid_parameter(
                f"Value {account} for parameter AWSAccountId is invalid. Reason: not an account id."
            )
    actions = _names(body, "Actions")
    for action in actions:
        if action not in GRANTABLE:
            raise invalid_parameter(
                f"Value SQS:{action} for parameter ActionName is invalid. Reason: only the SQS actions on a"
                f" queue may be granted: {', '.join(sorted(GRANTABLE))}."
            )
    async with _queue_meta(ctx, name) as meta:
        policy = _policy(meta, ctx.arn(name))
        if any(statement.get("Sid") == label for statement in policy["Statement"]):
            raise invalid_parameter(f"Value {label} for parameter Label is invalid. Reason: Already exists.")
        principals = [f"arn:aws:iam::{account}:root" for account in accounts]
        granted = [f"SQS:{action}" for action in actions]
        policy["Statement"].append(
            {
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
                "Action": granted[0] if len(granted) == 1 else granted,
                "Resource": ctx.arn(name),
            }
        )
        await _set_policy(meta, policy)
    return {}


async def remove_permission(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    label = _label(body)
    async with _queue_meta(ctx, name) as meta:
        policy = _policy(meta, ctx.arn(name))
        kept = [statement for statement in policy["Statement"] if statement.get("Sid") != label]
        if len(kept) == len(policy["Statement"]):
            raise invalid_parameter(
                f"Value {label} for parameter Label is invalid. Reason: can't find label."
            )
        await _set_policy(meta, {**policy, "Statement": kept} if kept else None)
    return {}


def _label(body: Body) -> str:
    label = string(body, "Label")
    assert label is not None
    if not LABEL.match(label):
        raise invalid_parameter(
            f"Value {label} for parameter Label is invalid. Reason: it must be 1 to {MAX_LABEL} letters,"
            " digits, hyphens or underscores."
        )
    return label


def _names(body: Body, parameter: str) -> list[str]:
    names = body.get(parameter)
    if not names:
        raise missing_parameter(parameter)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid_parameter(f"{parameter} must be a list of strings.")
    return names


def _policy(meta: QueueMeta, arn: str) -> dict[str, Any]:
    """The queue's access policy (its Policy attribute), or the empty one SQS starts from (the queue's
    `arn`)."""
    kept = meta.attributes.get("Policy")
    try:
        policy = json.loads(kept) if kept else None
    except ValueError:
        policy = None
    if not isinstance(policy, dict) or not isinstance(policy.get("Statement"), list):
        policy = {"Version": "2012-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": []}
    return policy


async def _set_policy(meta: QueueMeta, policy: dict[str, Any] | None) -> None:
    kept, removed = (
        ({"Policy": json.dumps(policy, separators=(",", ":"))}, []) if policy else ({}, ["Policy"])
    )
    await meta.set_attributes(kept, removed)


@asynccontextmanager
async def _queue_meta(ctx: Context, name: str) -> AsyncIterator[QueueMeta]:
    """The queue's tags and kept attributes, its row locked until the change is committed; an SQS error
    raised in the block changes nothing."""
    note(queue=name)
    async with sqs_queues.queue_meta(ctx.runtime.db, name) as meta:
        if meta is None:
            raise queue_does_not_exist(name)
        yield meta
