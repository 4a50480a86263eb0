"""Reading an SQS request's parameters: each checked as SQS checks it, refused with SQS's error."""

from __future__ import annotations

from typing import Any

from app.sqs.protocol import BATCH_ENTRY_ID, MAX_BATCH, SqsError, invalid_parameter, missing_parameter

Body = dict[str, Any]


def string(body: Body, name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise missing_parameter(name)
        return None
    if not isinstance(value, str):
        raise invalid_parameter(f"Value for parameter {name} must be a string.")
    return value


def integer(body: Body, name: str, low: int, high: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_parameter(
            f"Value {value} for parameter {name} is invalid. Reason: must be between {low} and {high}."
        )
    return value


def entries(body: Body, name: str) -> list[Body]:
    """The entries of a batch action: 1 to MAX_BATCH, each with a distinct, well-formed Id."""
    given = body.get(name)
    if given is None:
        raise missing_parameter(name)
    if not isinstance(given, list) or not all(isinstance(e, dict) for e in given):
        raise invalid_parameter(f"{name} must be a list of entries.")
    if not given:
        raise SqsError(
            "EmptyBatchRequest",
            "There should be at least one entry in the request.",
            query_code="AWS.SimpleQueueService.EmptyBatchRequest",
        )
    if len(given) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(given)}.",
            query_code="AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        )
    ids = [e.get("Id") for e in given]
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
    return given


def failed(entry_id: str, error: SqsError) -> Body:
    """A batch entry's failure, as a batch action's `Failed` lists it."""
    return {"Id": entry_id, "SenderFault": error.sender_fault, "Code": error.code, "Message": error.message}
