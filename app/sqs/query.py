"""SQS's older wire format, the AWS Query protocol: form-encoded requests, XML answers and XML errors.

SDKs released before late 2023 (the AWS SDK for Java 1.x, Go v1, botocore before 1.31.x, and PHP, Ruby and
.NET releases of that age) speak only this protocol; current SDKs speak JSON 1.0 (app/sqs/protocol.py).
app/sqs/router.py tells them apart per request, as SQS does: a form body (``Action=SendMessage&...``) is
the Query protocol, ``X-Amz-Target`` the JSON one. Both reach the same actions: a form is decoded into the
JSON protocol's body, and the action's JSON answer is encoded as the XML SQS sends, so every action,
check and error is written once.

The mapping follows SQS's published Query API (its service model, API version 2012-11-05): lists and maps
are "flattened", each item numbered from 1 under a name of its own (``AttributeName.1``,
``Attribute.1.Name`` and ``Attribute.1.Value``, ``SendMessageBatchRequestEntry.2.MessageBody``,
``MessageAttribute.1.Value.StringValue``), and the answer of action X is
``<XResponse><XResult>...</XResult><ResponseMetadata>...</ResponseMetadata></XResponse>``, its lists and
maps flattened the same way. Errors are ``<ErrorResponse>`` with the Query protocol's own codes
(``AWS.SimpleQueueService.NonExistentQueue`` where JSON says ``QueueDoesNotExist``).

A Query request may ask for JSON instead (``Accept: application/json``, ``wants_json``): it is then
answered with the action's JSON answer and JSON errors, exactly as a JSON 1.0 request is.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from starlette.responses import Response

from app.sqs.protocol import SqsError

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
CONTENT_TYPE = "text/xml"
FORM = "application/x-www-form-urlencoded"


# --- the shapes of requests and answers ----------------------------------------------------------------
# A member is a scalar (STRING, INTEGER, BOOLEAN), a List, a Map or a Struct. Scalars and structures go
# by their JSON name; a flattened list or map goes by the name of its items (AttributeNames: AttributeName.1).


STRING, INTEGER, BOOLEAN = "string", "integer", "boolean"


@dataclass(frozen=True)
class List:
    item: str  # each item's name: AttributeName (AttributeName.1, AttributeName.2, ...)
    of: Any


@dataclass(frozen=True)
class Map:
    entry: str  # each entry's name: Attribute (Attribute.1.Name, Attribute.1.Value, ...)
    key: str
    value: str
    of: Any


@dataclass(frozen=True)
class Struct:
    members: dict[str, Any]


_ATTRIBUTE_VALUE = Struct(
    {
        "StringValue": STRING,
        "BinaryValue": STRING,  # base64, in both protocols
        "StringListValues": List("StringListValue", STRING),
        "BinaryListValues": List("BinaryListValue", STRING),
        "DataType": STRING,
    }
)
_ATTRIBUTES = Map("Attribute", "Name", "Value", STRING)
_MESSAGE_ATTRIBUTES = Map("MessageAttribute", "Name", "Value", _ATTRIBUTE_VALUE)
_SYSTEM_ATTRIBUTES = Map("MessageSystemAttribute", "Name", "Value", _ATTRIBUTE_VALUE)
_QUEUE_URL = {"QueueUrl": STRING}
_BATCH_ERRORS = List(
    "BatchResultErrorEntry", Struct({"Id": STRING, "SenderFault": BOOLEAN, "Code": STRING, "Message": STRING})
)
_MESSAGE = Struct(
    {
        "MessageId": STRING,
        "ReceiptHandle": STRING,
        "MD5OfBody": STRING,
        "Body": STRING,
        "Attributes": _ATTRIBUTES,
        "MD5OfMessageAttributes": STRING,
        "MessageAttributes": _MESSAGE_ATTRIBUTES,
    }
)
_SENT = {
    "MD5OfMessageBody": STRING,
    "MD5OfMessageAttributes": STRING,
    "MD5OfMessageSystemAttributes": STRING,
    "MessageId": STRING,
    "SequenceNumber": STRING,
}
_TO_SEND = {
    "MessageBody": STRING,
    "DelaySeconds": INTEGER,
    "MessageAttributes": _MESSAGE_ATTRIBUTES,
    "MessageSystemAttributes": _SYSTEM_ATTRIBUTES,
    "MessageDeduplicationId": STRING,
    "MessageGroupId": STRING,
}
_MOVE_TASK = Struct(
    {
        "TaskHandle": STRING,
        "Status": STRING,
        "SourceArn": STRING,
        "DestinationArn": STRING,
        "MaxNumberOfMessagesPerSecond": INTEGER,
        "ApproximateNumberOfMessagesMoved": INTEGER,
        "ApproximateNumberOfMessagesToMove": INTEGER,
        "FailureReason": STRING,
        "StartedTimestamp": INTEGER,
    }
)

# Each action's request and answer. An answer of None: the action answers nothing but its request id.
ACTIONS: dict[str, tuple[Struct, Struct | None]] = {
    "CreateQueue": (
        Struct({"QueueName": STRING, "Attributes": _ATTRIBUTES, "tags": Map("Tag", "Key", "Value", STRING)}),
        Struct(_QUEUE_URL),
    ),
    "GetQueueUrl": (Struct({"QueueName": STRING, "QueueOwnerAWSAccountId": STRING}), Struct(_QUEUE_URL)),
    "ListQueues": (
        Struct({"QueueNamePrefix": STRING, "NextToken": STRING, "MaxResults": INTEGER}),
        Struct({"QueueUrls": List("QueueUrl", STRING), "NextToken": STRING}),
    ),
    "DeleteQueue": (Struct(_QUEUE_URL), None),
    "PurgeQueue": (Struct(_QUEUE_URL), None),
    "GetQueueAttributes": (
        Struct({**_QUEUE_URL, "AttributeNames": List("AttributeName", STRING)}),
        Struct({"Attributes": _ATTRIBUTES}),
    ),
    "SetQueueAttributes": (Struct({**_QUEUE_URL, "Attributes": _ATTRIBUTES}), None),
    "ListDeadLetterSourceQueues": (
        Struct({**_QUEUE_URL, "NextToken": STRING, "MaxResults": INTEGER}),
        Struct({"queueUrls": List("QueueUrl", STRING), "NextToken": STRING}),
    ),
    "SendMessage": (Struct({**_QUEUE_URL, **_TO_SEND}), Struct(_SENT)),
    "SendMessageBatch": (
        Struct(
            {
                **_QUEUE_URL,
                "Entries": List("SendMessageBatchRequestEntry", Struct({"Id": STRING, **_TO_SEND})),
            }
        ),
        Struct(
            {
                "Successful": List("SendMessageBatchResultEntry", Struct({"Id": STRING, **_SENT})),
                "Failed": _BATCH_ERRORS,
            }
        ),
    ),
    "ReceiveMessage": (
        Struct(
            {
                **_QUEUE_URL,
                "AttributeNames": List("AttributeName", STRING),
                "MessageSystemAttributeNames": List("MessageSystemAttributeName", STRING),
                "MessageAttributeNames": List("MessageAttributeName", STRING),
                "MaxNumberOfMessages": INTEGER,
                "VisibilityTimeout": INTEGER,
                "WaitTimeSeconds": INTEGER,
                "ReceiveRequestAttemptId": STRING,
            }
        ),
        Struct({"Messages": List("Message", _MESSAGE)}),
    ),
    "DeleteMessage": (Struct({**_QUEUE_URL, "ReceiptHandle": STRING}), None),
    "DeleteMessageBatch": (
        Struct(
            {
                **_QUEUE_URL,
                "Entries": List(
                    "DeleteMessageBatchRequestEntry", Struct({"Id": STRING, "ReceiptHandle": STRING})
                ),
            }
        ),
        Struct(
            {
                "Successful": List("DeleteMessageBatchResultEntry", Struct({"Id": STRING})),
                "Failed": _BATCH_ERRORS,
            }
        ),
    ),
    "ChangeMessageVisibility": (
        Struct({**_QUEUE_URL, "ReceiptHandle": STRING, "VisibilityTimeout": INTEGER}),
        None,
    ),
    "ChangeMessageVisibilityBatch": (
        Struct(
            {
                **_QUEUE_URL,
                "Entries": List(
                    "ChangeMessageVisibilityBatchRequestEntry",
                    Struct({"Id": STRING, "ReceiptHandle": STRING, "VisibilityTimeout": INTEGER}),
                ),
            }
        ),
        Struct(
            {
                "Successful": List("ChangeMessageVisibilityBatchResultEntry", Struct({"Id": STRING})),
                "Failed": _BATCH_ERRORS,
            }
        ),
    ),
    "TagQueue": (Struct({**_QUEUE_URL, "Tags": Map("Tag", "Key", "Value", STRING)}), None),
    "UntagQueue": (Struct({**_QUEUE_URL, "TagKeys": List("TagKey", STRING)}), None),
    "ListQueueTags": (Struct(_QUEUE_URL), Struct({"Tags": Map("Tag", "Key", "Value", STRING)})),
    "AddPermission": (
        Struct(
            {
                **_QUEUE_URL,
                "Label": STRING,
                "AWSAccountIds": List("AWSAccountId", STRING),
                "Actions": List("ActionName", STRING),
            }
        ),
        None,
    ),
    "RemovePermission": (Struct({**_QUEUE_URL, "Label": STRING}), None),
    "StartMessageMoveTask": (
        Struct({"SourceArn": STRING, "DestinationArn": STRING, "MaxNumberOfMessagesPerSecond": INTEGER}),
        Struct({"TaskHandle": STRING}),
    ),
    "ListMessageMoveTasks": (
        Struct({"SourceArn": STRING, "MaxResults": INTEGER}),
        Struct({"Results": List("ListMessageMoveTasksResultEntry", _MOVE_TASK)}),
    ),
}


# --- requests ------------------------------------------------------------------------------------------


# The most parameters a Query request may have, its URL's and its form's together. The largest valid one,
# a SendMessageBatch of 10 entries each with 10 message attributes and a trace header, has under 400; a
# form is counted (its separators, at C speed) before it is parsed.
MAX_FIELDS = 1000
# A list's or map's items are numbered 1, 2, 3, ... (``AttributeName.1``): in ASCII digits, at most 4 of
# them, as no list of a valid request comes near 10,000 items.
_INDEX = re.compile(r"[1-9][0-9]{0,3}")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_form(body: bytes, query: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A Query request's parameters: those of its URL, then those of its form body (SQS reads both)."""
    fields = len(query) + (body.count(b"&") + 1 if body else 0)
    if fields > MAX_FIELDS:
        raise SqsError(
            "MalformedQueryString",
            f"The request has {fields} parameters; an SQS request has at most {MAX_FIELDS}.",
        )
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise SqsError("MalformedQueryString", "The request body is not UTF-8.") from exc
    return [*query, *parse_qsl(text, keep_blank_values=True)]


# The batch actions, whose entries are a required list. A flattened list with no items has no parameter
# at all (or one empty one, ``SendMessageBatchRequestEntry=``, as botocore sends it): either way the
# batch is empty, and SQS answers EmptyBatchRequest, not MissingParameter.
_BATCHES = frozenset({"SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"})


def request_body(action: str, params: list[tuple[str, str]]) -> dict[str, Any]:
    """The JSON protocol's body of a Query request for ``action``: ``decode`` on the action's shape, and
    a batch without entries given its empty list of entries, as the Query protocol cannot tell them
    apart."""
    body = decode(ACTIONS[action][0], params)
    if action in _BATCHES:
        body.setdefault("Entries", [])
    return body


def decode(shape: Struct, params: list[tuple[str, str]]) -> dict[str, Any]:
    """The JSON protocol's body for a Query request's parameters (``Action`` and ``Version`` aside)."""
    tree: dict[str, Any] = {}
    for name, value in params:
        node = tree
        *path, last = name.split(".")
        for part in path:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # "A=1" then "A.1=2": the deeper one wins
                child = node[part] = {}
            node = child
        if not isinstance(node.get(last), dict):
            node[last] = value
    return _struct(shape, tree, "")


def _struct(shape: Struct, node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    out: dict[str, Any] = {}
    for name, member in shape.members.items():
        wire = _wire_name(name, member)
        if wire in node:
            value = _value(member, node[wire], f"{where}{wire}")
            if value is not None:
                out[name] = value
    return out


def _wire_name(name: str, member: Any) -> str:
    if isinstance(member, List):
        return member.item
    if isinstance(member, Map):
        return member.entry
    return name


def _value(member: Any, node: Any, where: str) -> Any:
    if member == STRING:
        return node if isinstance(node, str) else None
    if member == INTEGER:
        if not isinstance(node, str):
            return None
        try:
            if not _INTEGER.fullmatch(node):  # int() also takes "٣", " 3 " and "1_000"
                raise ValueError(node)
            return int(node)
        except ValueError:  # and past Python's 4,300 digits
            reason = f"Value {_quoted(node)} for parameter {where} is invalid. Reason: not an integer."
            raise SqsError("InvalidParameterValue", reason) from None
    if member == BOOLEAN:
        return node == "true" if isinstance(node, str) else None
    if isinstance(member, Struct):
        return _struct(member, node, f"{where}.")
    if not isinstance(node, dict):  # "AttributeName=" is how an SDK sends an empty list
        return [] if isinstance(member, List) else {}
    for key in node:
        if not _INDEX.fullmatch(key):
            raise SqsError(
                "InvalidParameterValue",
                f"The parameter {where}.{_quoted(key)} is invalid. Reason: the items of {where} are"
                f" numbered 1, 2, 3, ... in ASCII digits, up to 9999.",
            )
    items = [node[i] for i in sorted(node, key=int)]
    if isinstance(member, List):
        return [_value(member.of, item, f"{where}.{n}") for n, item in enumerate(items, 1)]
    entries = {}
    for n, item in enumerate(items, 1):
        if isinstance(item, dict) and isinstance(item.get(member.key), str):
            value = item.get(member.value)
            entries[item[member.key]] = _value(member.of, value, f"{where}.{n}.{member.value}")
    return entries


def _quoted(text: str) -> str:
    """What a client sent, for an error's words: its first 40 characters."""
    return text if len(text) <= 40 else f"{text[:40]}..."


# --- answers -------------------------------------------------------------------------------------------

# The media types of the JSON answers a Query request may ask for.
JSON_TYPES = frozenset({"application/json", "application/x-amz-json-1.0"})


def wants_json(accept: str) -> bool:
    """Whether an Accept header asks for JSON by name (a media range of quality 0 refuses it): SQS then
    answers a Query request as it answers the JSON protocol. ``*/*``, or no Accept, is answered in XML,
    the Query protocol's own format, which every SDK of that protocol expects."""
    for media_range in accept.split(","):
        media_type, *parameters = (part.strip().lower() for part in media_range.split(";"))
        if media_type in JSON_TYPES and not any(_refused(p) for p in parameters):
            return True
    return False


def _refused(parameter: str) -> bool:
    """Whether a media range's parameter is a quality of 0 (``q=0``, ``q=0.000``)."""
    name, _, value = parameter.partition("=")
    return name.strip() == "q" and value.strip().rstrip("0").rstrip(".") in ("0", "")


def request_id() -> str:
    return str(uuid.uuid4())


def answer(action: str, body: dict[str, Any]) -> Response:
    """The XML answer of ``action`` for its JSON answer ``body``."""
    result = ACTIONS[action][1]
    inner = f"<{action}Result>{_encode_struct(result, body)}</{action}Result>" if result else ""
    metadata = f"<ResponseMetadata><RequestId>{request_id()}</RequestId></ResponseMetadata>"
    xml = f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">{inner}{metadata}</{action}Response>'
    return Response(xml.encode(), media_type=CONTENT_TYPE)


def error(err: SqsError) -> Response:
    """An error as the Query protocol reports it: its legacy code, fault, message and a request id."""
    fault = "Sender" if err.sender_fault else "Receiver"
    xml = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error><Type>{fault}</Type>'
        f"<Code>{_text(err.query_code)}</Code><Message>{_text(err.message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id()}</RequestId></ErrorResponse>"
    )
    return Response(xml.encode(), status_code=err.status, media_type=CONTENT_TYPE)


def _encode_struct(shape: Struct, body: dict[str, Any]) -> str:
    parts = []
    for name, member in shape.members.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(member, List):
            parts += [f"<{member.item}>{_encode(member.of, item)}</{member.item}>" for item in value]
        elif isinstance(member, Map):
            parts += [
                f"<{member.entry}><{member.key}>{_text(key)}</{member.key}>"
                f"<{member.value}>{_encode(member.of, item)}</{member.value}></{member.entry}>"
                for key, item in value.items()
            ]
        else:
            parts.append(f"<{name}>{_encode(member, value)}</{name}>")
    return "".join(parts)


def _encode(member: Any, value: Any) -> str:
    if isinstance(member, Struct):
        return _encode_struct(member, value)
    if member == BOOLEAN:
        return "true" if value else "false"
    return _text(str(value))


# Characters XML 1.0 cannot carry at all, even as references. SQS refuses them in messages; an error's
# words may quote what a client sent, so they are replaced there.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    # A carriage return as a character reference: an XML parser would turn a literal one into \n.
    return escape(_NOT_XML.sub("\ufffd", value), {"\r": "&#xD;"})
