"""AWS Signature Version 4 for the SQS API, checked with hmac against the configured credentials.

With bearer tokens configured (``JOBQ_TOKENS``), jobq is secured, and so is its SQS API: every request
must be signed with an access key id of ``JOBQ_AWS_CREDENTIALS``, whose role decides what it may do
(as for tokens: producers send, workers receive, delete and change visibility, admins do everything;
creating queues and reading them is open to every role, since SDKs and Celery do it on start).
Without tokens, signatures are not required (and not checked).

The errors are the ones AWS answers and SDKs know: MissingAuthenticationToken (no signature),
InvalidClientTokenId (unknown access key), SignatureDoesNotMatch, RequestExpired (a signing time more
than 15 minutes off), AccessDenied (a role that may not do this).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import Request

from app.auth import Role
from app.sqs.protocol import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60  # seconds between the signing time and now, either way

_EVERYONE = {"CreateQueue", "GetQueueUrl", "ListQueues", "GetQueueAttributes"}
ROLES: dict[Role, set[str]] = {
    Role.PRODUCER: _EVERYONE | {"SendMessage", "SendMessageBatch"},
    Role.WORKER: _EVERYONE
    | {
        "ReceiveMessage",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
    },
}

_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<signature>[0-9a-f]{64})$"
)


def _denied(code: str, message: str) -> SqsError:
    return SqsError(code, message, status=403)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def canonical_request(request: Request, signed_headers: list[str], body: bytes) -> str:
    query = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in request.query_params.multi_items()
    )
    headers = "".join(
        f"{name}:{' '.join(request.headers.get(name, '').split())}\n" for name in signed_headers
    )
    payload = request.headers.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()
    if payload == "UNSIGNED-PAYLOAD":
        payload = hashlib.sha256(body).hexdigest()
    return "\n".join(
        [
            request.method,
            quote(request.url.path, safe="/-_.~") or "/",
            "&".join(f"{k}={v}" for k, v in query),
            headers,
            ";".join(signed_headers),
            payload,
        ]
    )


async def check(request: Request, body: bytes, action: str) -> None:
    if not request.app.state.tokens:
        return
    header = request.headers.get("authorization", "")
    match = _AUTHORIZATION.match(header.strip())
    if match is None:
        raise _denied(
            "MissingAuthenticationToken",
            "Requests must be signed with AWS Signature Version 4 (an access key id and secret).",
        )
    parts = match["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise _denied("IncompleteSignature", "The Credential of the Authorization header is malformed.")
    key_id, date, region, service, _ = parts
    credential = request.app.state.settings.aws_credentials.get(key_id)
    if credential is None:
        raise _denied("InvalidClientTokenId", "The security token included in the request is invalid.")
    signed_headers = match["signed"].split(";")
    if "host" not in signed_headers:
        raise _denied("SignatureDoesNotMatch", "The host header must be signed.")
    amz_date = request.headers.get("x-amz-date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise _denied("IncompleteSignature", "X-Amz-Date is missing or malformed.") from exc
    if abs((datetime.now(UTC) - when).total_seconds()) > MAX_SKEW or not amz_date.startswith(date):
        raise _denied("RequestExpired", "Signature expired: the signing time is more than 15 minutes off.")
    scope = f"{date}/{region}/{service}/aws4_request"
    digest = hashlib.sha256(canonical_request(request, signed_headers, body).encode()).hexdigest()
    string_to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"
    expected = hmac.new(
        signing_key(credential.secret, date, region, service), string_to_sign.encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, match["signature"]):
        raise _denied(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )
    if credential.role != Role.ADMIN and action not in ROLES[credential.role]:
        raise _denied("AccessDenied", f"A {credential.role} key may not call {action}.")
