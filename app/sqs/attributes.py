"""Queue and message attributes as SQS spells them, checked and mapped onto jobq's queue settings.

jobq keeps what it has a column for in its own settings (VisibilityTimeout -> visibility_timeout,
RedrivePolicy's maxReceiveCount -> max_attempts) and the rest in ``queues.sqs_attributes``, FIFO queues'
attributes included (a queue is FIFO when it keeps ``FifoQueue`` "true"; app/sqs/fifo.py). SQS reads a
boolean attribute in any case ("True", "FALSE"), and jobq keeps it in lower case, as SQS shows it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from app.db.sql.fragments import DEAD_LETTER_KEY
from app.sqs.protocol import SqsError, invalid_parameter
from app.sqs.regions import arn_parts

# A queue created through SQS without a RedrivePolicy keeps its messages however often they are
# received (SQS has no limit there); jobq needs a number, so it takes the API's largest.
NO_REDRIVE_MAX_ATTEMPTS = 1000
MAX_RECEIVE_COUNT = 1000
# SQS's largest message, and the default MaximumMessageSize of a queue: 1 MiB (body and attributes).
MAX_MESSAGE_BYTES = 1024 * 1024

# Integer attributes: (lowest, highest, default).
INTEGER = {
    "VisibilityTimeout": (0, 43200, 30),
    "DelaySeconds": (0, 900, 0),
    "MessageRetentionPeriod": (60, 1209600, 345600),
    "MaximumMessageSize": (1024, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES),
    "ReceiveMessageWaitTimeSeconds": (0, 20, 0),
    "KmsDataKeyReusePeriodSeconds": (60, 86400, 300),
}
# Kept and shown as given; jobq has nothing to do with them.
OPAQUE = {"Policy", "KmsMasterKeyId", "RedriveAllowPolicy"}
# Attributes that are "true" or "false", in any case.
BOOLEAN = {"FifoQueue", "ContentBasedDeduplication", "SqsManagedSseEnabled"}
# FIFO queues' attributes: the values each takes, the first what a FIFO queue has unless told otherwise.
# Only a FIFO queue has them (a standard queue knows no such attribute, as in SQS); FifoQueue cannot
# change once the queue is made.
FIFO = {
    "FifoQueue": ("true", "false"),
    "ContentBasedDeduplication": ("false", "true"),
    "DeduplicationScope": ("queue", "messageGroup"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
COMPUTED = {
    "All",
    "QueueArn",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
}
SETTABLE = set(INTEGER) | OPAQUE | BOOLEAN | set(FIFO) | {"RedrivePolicy"}


def _unknown(name: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")


def _invalid_value(name: str, reason: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}. Reason: {reason}")


def is_fifo_name(name: str) -> bool:
    return name.endswith(".fifo")


def _boolean(name: str, value: str) -> str:
    """A boolean attribute's value as jobq keeps it: "true" or "false", given in any case, as SQS reads
    them; anything else is refused."""
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise _invalid_value(name, "must be true or false.")
    return lowered


def _fifo_queue(value: str, *, fifo: bool) -> str:
    """FifoQueue as SQS reads it, on CreateQueue (queues.create_queue has read it and checked the name
    against it) and SetQueueAttributes alike. A standard queue knows no such attribute, so "false" on one is
    refused as an unknown attribute; a FIFO queue takes "true" as the no-op it is and refuses anything
    else, since a queue's type cannot change."""
    if not fifo:
        raise _unknown("FifoQueue")
    if value.lower() != "true":
        raise _invalid_value("FifoQueue", "Modifying queue type is not supported.")
    return "true"


def _fifo_attribute(name: str, value: str, *, fifo: bool) -> str:
    """The value to keep of a FIFO queue's attribute, checked as SQS checks it."""
    if name == "FifoQueue":
        return _fifo_queue(value, fifo=fifo)
    if not fifo:
        raise _unknown(name)
    if name in BOOLEAN:
        return _boolean(name, value)
    if value not in FIFO[name]:
        raise _invalid_value(name, f"must be one of {', '.join(FIFO[name])}.")
    return value


def check_queue_attributes(
    attributes: Any, *, fifo: bool, current: dict[str, str] | None = None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Validate Attributes of CreateQueue or SetQueueAttributes of a queue that is or will be FIFO
    (`fifo`) and keeps the attributes `current`: (what to keep in sqs_attributes, what to set in jobq's
    settings)."""
    if attributes is None:
        return {}, {}
    if not isinstance(attributes, dict):
        raise invalid_parameter("Attributes must be a map of attribute names to string values.")
    keep: dict[str, str] = {}
    settings: dict[str, Any] = {}
    for name, value in attributes.items():
        if name not in SETTABLE:
            raise _unknown(name)
        if not isinstance(value, str):
            raise invalid_parameter(f"Value for attribute {name} must be a string.")
        if name in FIFO:
            keep[name] = _fifo_attribute(name, value, fifo=fifo)
        elif name in BOOLEAN:
            keep[name] = _boolean(name, value)
        elif name in INTEGER:
            low, high, _ = INTEGER[name]
            if not re.fullmatch(r"-?\d{1,12}", value) or not low <= int(value) <= high:
                raise _invalid_value(name, f"must be an integer from {low} to {high}.")
            if name == "VisibilityTimeout":
                # 0 is SQS's own: its receives hand messages out visible at once (receiving.py). jobq's
                # leases must last a moment, so the queue's visibility_timeout stays as it was for leases
                # through jobq's API, and the 0 is kept as the SQS attribute, shown in its place.
                if int(value) == 0:
                    keep[name] = "0"
                else:
                    settings["visibility_timeout"] = float(value)
                    keep[name] = ""  # no longer 0, if it was
                continue
            keep[name] = value
        elif name == "RedrivePolicy":
            if value == "":
                keep[name] = ""
                settings["max_attempts"] = NO_REDRIVE_MAX_ATTEMPTS
                continue
            try:
                policy = json.loads(value)
                count = int(policy["maxReceiveCount"])
                target = policy["deadLetterTargetArn"]
            except (ValueError, KeyError, TypeError) as exc:
                raise _invalid_value(
                    name, "it must be JSON with deadLetterTargetArn and maxReceiveCount."
                ) from exc
            if not isinstance(target, str) or not 1 <= count <= MAX_RECEIVE_COUNT:
                raise _invalid_value(name, f"maxReceiveCount must be from 1 to {MAX_RECEIVE_COUNT}.")
            # As SQS: a FIFO queue's dead-letter queue is a FIFO queue, a standard queue's a standard one
            # (a queue made through SQS is FIFO exactly when its name ends in .fifo).
            if is_fifo_name(arn_parts(target, "deadLetterTargetArn")[1]) != fifo:
                raise _invalid_value(
                    name,
                    "the dead-letter queue of a FIFO queue must also be a FIFO queue, and the dead-letter "
                    "queue of a standard queue must also be a standard queue.",
                )
            keep[name] = json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": count})
            settings["max_attempts"] = count
        else:
            keep[name] = value
    if fifo:
        merged = {**(current or {}), **keep}
        if (
            merged.get("FifoThroughputLimit") == "perMessageGroupId"
            and merged.get("DeduplicationScope") != "messageGroup"
        ):
            raise _invalid_value(
                "FifoThroughputLimit",
                "perMessageGroupId is allowed only when DeduplicationScope is messageGroup.",
            )
    return keep, settings


def shown_policy(kept: str) -> dict[str, Any]:
    """A kept RedrivePolicy as SQS shows it."""
    policy = json.loads(kept)
    policy.pop(DEAD_LETTER_KEY, None)
    return policy


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def queue_attributes(row: Any, arn: str, stats: dict[str, Any]) -> dict[str, str]:
    """Every attribute of the queue of `arn`, as GetQueueAttributes shows them (strings)."""
    kept = row["sqs_attributes"]
    if isinstance(kept, str):
        kept = json.loads(kept)
    out = {
        "QueueArn": arn,
        "VisibilityTimeout": _seconds(row["visibility_timeout"]),
        "ApproximateNumberOfMessages": str(stats["pending"]),
        "ApproximateNumberOfMessagesNotVisible": str(stats["running"]),
        "ApproximateNumberOfMessagesDelayed": str(stats["scheduled"]),
        "CreatedTimestamp": str(int(row["created_at"].timestamp())),
        "LastModifiedTimestamp": str(int(row["updated_at"].timestamp())),
        "SqsManagedSseEnabled": "false",
    }
    for name, (_, _, default) in INTEGER.items():
        if name not in ("VisibilityTimeout", "KmsDataKeyReusePeriodSeconds"):
            out[name] = str(default)
    if kept.get("FifoQueue") == "true":
        out.update({name: values[0] for name, values in FIFO.items()})
    for name, value in kept.items():
        if name == "RedrivePolicy":
            if value:
                # maxReceiveCount is the queue's max_attempts now, also if jobq's API changed it since.
                policy = shown_policy(value)
                policy["maxReceiveCount"] = row["max_attempts"]
                out[name] = json.dumps(policy, separators=(",", ":"))
        else:
            out[name] = value
    return out


# --- message attributes ----------------------------------------------------------------------------

# Letters (any script's: SQS takes "attr.1øßä"), digits, _, - and .; at most 256.
_ATTRIBUTE_NAME = re.compile(r"^[\w.-]{1,256}$")
# Message attribute names SQS keeps for itself, whatever their case.
_RESERVED_PREFIXES = ("aws.", "amazon.")
# The characters SQS allows in a message: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF.
_INVALID_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def check_message_text(text: str, what: str, code: str = "InvalidMessageContents") -> None:
    """SQS's characters only; else `code` (a body's InvalidMessageContents, an attribute value's
    InvalidParameterValue, as SQS answers each)."""
    if _INVALID_CHARACTER.search(text):
        raise SqsError(code, f"Invalid characters found in {what}.")


def _check_attribute_name(name: str) -> None:
    """A message attribute's name as SQS takes it: 1 to 256 letters, digits, _, - and ., not starting
    with SQS's reserved prefixes "AWS." and "Amazon." in any case, and with its periods between other
    characters only (none first or last, no two in a row); else InvalidParameterValue, as SQS answers."""
    if not _ATTRIBUTE_NAME.match(name):
        raise invalid_parameter(
            f"Message (user) attribute name '{name}' is invalid. A name is 1 to 256 letters, digits, "
            "underscores, hyphens and periods."
        )
    if name.lower().startswith(_RESERVED_PREFIXES):
        raise invalid_parameter(
            f"Message (user) attribute name '{name}' is reserved for use by SQS: names can't start with "
            "'AWS.' or 'Amazon.', in any case."
        )
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise invalid_parameter(
            f"Message (user) attribute name '{name}' is invalid. A name can't start or end with a period, "
            "or have two periods in a row."
        )


def check_message_attributes(attributes: Any) -> dict[str, dict[str, str]]:
    """Validate MessageAttributes of a message; the attributes as they will be kept and answered."""
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        raise invalid_parameter("MessageAttributes must be a map.")
    if len(attributes) > 10:
        raise invalid_parameter(
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum [10]."
        )
    out: dict[str, dict[str, str]] = {}
    for name, attribute in attributes.items():
        _check_attribute_name(name)
        if not isinstance(attribute, dict) or not isinstance(attribute.get("DataType"), str):
            raise invalid_parameter(f"The message attribute '{name}' must contain a non-empty data type.")
        data_type = attribute["DataType"]
        base = data_type.split(".", 1)[0]
        if base not in ("String", "Number", "Binary") or len(data_type) > 256:
            raise invalid_parameter(f"The message attribute '{name}' has an invalid message attribute type.")
        if attribute.get("StringListValues") or attribute.get("BinaryListValues"):
            raise invalid_parameter(f"The message attribute '{name}': list values are not supported.")
        if base == "Binary":
            value = attribute.get("BinaryValue")
            try:
                base64.b64decode(value, validate=True) if isinstance(value, str) else None
            except binascii.Error:
                value = None
            if not isinstance(value, str) or not value:
                raise invalid_parameter(f"The message attribute '{name}' must contain a non-empty value.")
            out[name] = {"DataType": data_type, "BinaryValue": value}
            continue
        value = attribute.get("StringValue")
        if not isinstance(value, str) or not value:
            raise invalid_parameter(f"The message attribute '{name}' must contain a non-empty value.")
        check_message_text(value, f"the message attribute '{name}'", "InvalidParameterValue")
        if base == "Number":
            try:
                Decimal(value)
            except InvalidOperation as exc:
                raise invalid_parameter(f"Can't cast message attribute '{name}' to a number.") from exc
        out[name] = {"DataType": data_type, "StringValue": value}
    return out


def select_message_attributes(attributes: dict[str, Any] | None, names: Any) -> dict[str, Any]:
    """The message attributes a receive asked for: "All", ".*", names, or prefixes "name.*"."""
    if not attributes or not isinstance(names, list) or not names:
        return {}
    if "All" in names or ".*" in names:
        return dict(attributes)
    out = {}
    for name, value in attributes.items():
        for wanted in names:
            if not isinstance(wanted, str):
                continue
            if wanted == name or (wanted.endswith(".*") and name.startswith(wanted[:-1])):
                out[name] = value
                break
    return out
