"""What a receipt handle does, each one of jobq's own operations under the lease token the handle carries:
DeleteMessage acks, ChangeMessageVisibility extends (or, to 0, nacks for a retry at once), and their
batches. So jobq's fencing holds: a handle from an earlier receive deletes nothing once the message was
received again (ReceiptHandleIsInvalid), and changes nothing of its visibility either (MessageNotInflight),
where SQS lets ChangeMessageVisibility through. The consumer holding the older handle has lost the message
to the later receive; were it still able to hide the message, or to make it visible at once, it would move
the other consumer's deadline, and the message would be handed out a third time while the second consumer
is still at it, or kept from anyone long after both are done. A handle is valid on the queue whose receive
handed it out only, as in SQS: the queue its lease token names must be the one the request is for, else
ReceiptHandleIsInvalid.
"""

from __future__ import annotations

from typing import Any

from app import service
from app.core.errors import Invalid, LeaseLost, NotFound
from app.core.limits import MAX_LEASE_TOKEN
from app.core.states import FINISHED
from app.core.tokens import parse_token
from app.http.middleware.access_log import note
from app.service import sqs_messages
from app.sqs.context import Context
from app.sqs.params import Body, entries, failed
from app.sqs.protocol import (
    SqsError,
    invalid_parameter,
    missing_parameter,
    parse_receipt_handle,
    receipt_handle_invalid,
)

# A receipt handle may carry a spelling of a UUID longer than MAX_LEASE_TOKEN (uuid.UUID ignores any
# number of hyphens); DeleteMessage and a visibility of 0 refuse it as the API would, for the whole request.


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
    name = ctx.of_url(body.get("QueueUrl"))
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
    name = ctx.of_url(body.get("QueueUrl"))
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
        "The message referred to isn't in flight under this receipt handle: another receive has it, or it"
        " is visible. Only the handle of the receive that has it changes its visibility.",
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
    name = ctx.of_url(body.get("QueueUrl"))
    note(queue=name)
    await _change_visibility(ctx, name, body.get("ReceiptHandle"), body.get("VisibilityTimeout"))
    return {}


async def change_message_visibility_batch(ctx: Context, body: Body) -> Body:
    name = ctx.of_url(body.get("QueueUrl"))
    note(queue=name)
    successful, refused = [], []
    for entry in entries(body, "Entries"):
        try:
            await _change_visibility(ctx, name, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout"))
            successful.append({"Id": entry["Id"]})
        except SqsError as error:
            refused.append(failed(entry["Id"], error))
    return {"Successful": successful, "Failed": refused}
