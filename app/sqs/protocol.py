"""The wire format of SQS in the AWS JSON 1.0 protocol: errors, digests, message ids, receipt handles.

Requests are ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON body; answers are JSON
(``application/x-amz-json-1.0``). Errors are ``{"__type": "com.amazonaws.sqs#<Code>", "message"}`` with
the status SQS gives, plus the ``x-amzn-query-error`` header that SQS sends so SDKs written for its
older query protocol still see the codes they know (botocore reads it too).
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from typing import Any

import orjson
from starlette.responses import Response

from app.core.limits import MAX_JOB_ID
from app.core.tokens import parse_token

CONTENT_TYPE = "application/x-amz-json-1.0"
ACCOUNT = "000000000000"  # every queue URL and ARN names this account (regions: app/sqs/regions.py)

# Queue names SQS accepts: 1-80 of A-Z a-z 0-9 - _ (jobq's own names may also hold . and :).
SQS_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
# A FIFO queue's: the same, ending in .fifo, 80 characters in all.
FIFO_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
BATCH_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
MAX_BATCH = 10


class SqsError(Exception):
    """An error as SQS reports it: its code, HTTP status and the legacy query-protocol code."""

    def __init__(self, code: str, message: str, status: int = 400, query_code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.query_code = query_code or code
        self.sender_fault = status < 500

    def response(self) -> Response:
        body = orjson.dumps({"__type": f"com.amazonaws.sqs#{self.code}", "message": self.message})
        fault = "Sender" if self.sender_fault else "Receiver"
        return Response(
            body,
            status_code=self.status,
            media_type=CONTENT_TYPE,
            headers={"x-amzn-query-error": f"{self.query_code};{fault}"},
        )


def queue_does_not_exist(name: str, where: str = "") -> SqsError:
    """SQS's error for a queue that is not there; `where` ends the sentence (" in eu-west-1: ...")."""
    return SqsError(
        "QueueDoesNotExist",
        f"The specified queue {name} does not exist{where}.",
        query_code="AWS.SimpleQueueService.NonExistentQueue",
    )


def invalid_parameter(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def missing_parameter(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def receipt_handle_invalid(message: str = "The input receipt handle is invalid.") -> SqsError:
    return SqsError("ReceiptHandleIsInvalid", message)


def json_answer(body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), media_type=CONTENT_TYPE)


# --- digests ---------------------------------------------------------------------------------------


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode()).hexdigest()


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes as AWS computes it: attributes sorted by name, each as the length-prefixed
    (4 bytes, big-endian) name and data type, a transport byte (1 string, 2 binary) and the
    length-prefixed value."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        attribute = attributes[name]
        data_type = attribute["DataType"]
        for part in (name.encode(), data_type.encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        if "StringValue" in attribute:
            value = attribute["StringValue"].encode()
            digest.update(b"\x01")
        else:
            value = base64.b64decode(attribute["BinaryValue"])
            digest.update(b"\x02")
        digest.update(struct.pack(">I", len(value)) + value)
    return digest.hexdigest()


# --- message ids -----------------------------------------------------------------------------------

# A message's MessageId is a UUID, as SQS's are (clients store them as such), that carries its job's id:
# "6a6f6271" ("jobq" in ASCII), the id's high 16 bits, the UUID's version and variant, and the id's low 48
# bits, in hex. Job 2308206 is message 6a6f6271-0000-4000-8000-00000023386e; `job_id_of` reads it back.
_MESSAGE_ID = re.compile(r"^6a6f6271-([0-9a-f]{4})-4000-8000-([0-9a-f]{12})$")


def message_id(job_id: int) -> str:
    return f"6a6f6271-{job_id >> 48:04x}-4000-8000-{job_id & 0xFFFF_FFFF_FFFF:012x}"


def job_id_of(message: str) -> int | None:
    """The job a MessageId names; None for one jobq did not make."""
    match = _MESSAGE_ID.match(message)
    return int(match[1], 16) << 48 | int(match[2], 16) if match else None


# --- receipt handles -------------------------------------------------------------------------------


def receipt_handle(job_id: int, lease_token: str) -> str:
    """The job id and the lease's token: deleting with it is an ack fenced by that token."""
    return base64.urlsafe_b64encode(f"{job_id}:{lease_token}".encode()).decode().rstrip("=")


def parse_receipt_handle(handle: Any) -> tuple[int, str]:
    if not isinstance(handle, str) or not handle or len(handle) > 1024:
        raise receipt_handle_invalid()
    try:
        text = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        job_id, token = text.split(":", 1)
        number = int(job_id)
        if parse_token(token)[0] is None:
            raise ValueError(token)
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors
        reason = f'The input receipt handle "{handle}" is not a valid receipt handle.'
        raise receipt_handle_invalid(reason) from exc
    if not 1 <= number <= MAX_JOB_ID:
        raise receipt_handle_invalid()
    return number, token
