"""AWS Signature Version 4 for the SQS API, checked with hmac against the configured credentials.

With access keys configured (``JOBQ_AWS_CREDENTIALS``) or bearer tokens (``JOBQ_TOKENS``), every
request must be signed with an access key id of ``JOBQ_AWS_CREDENTIALS``, whose roles decide what it may
do (``ROLES`` below, as for tokens: producers send, workers receive, delete and change visibility,
viewers only read, admins do everything; producers and workers may also create queues, since SDKs and
Celery do it on start; a key with several roles may do what each may). A key limited to queue-name
patterns (``"queues": ["celery-*"]``, app/core/access.py) is refused (AccessDenied) any action on a queue
outside them, whether named by QueueUrl, QueueName or ARN, and ListQueues shows it its queues only. That
holds for a queue named inside an attribute too: a RedrivePolicy's dead-letter queue, on CreateQueue and
SetQueueAttributes alike (app/sqs/queues.py), or a scoped key could have its messages moved into any
queue. Keys without tokens are enforced too: configuring a key and leaving the API open would be a trap. With
neither, signatures are not required (and not checked), as for the rest of a service without tokens.

What a signature covers is what Amazon SQS makes it cover, so a captured request cannot be replayed
as another within its 15 minutes:

- The body. Its SHA-256 is computed here, never taken from the client: ``x-amz-content-sha256``, when
  sent, must equal it. ``UNSIGNED-PAYLOAD`` is refused, as SQS does (only S3 accepts unsigned
  payloads; every SQS SDK signs the body).
- ``host`` and ``x-amz-date`` must be signed, and so must ``x-amz-target`` (the action) and
  ``content-type`` whenever the request carries them, as botocore and the JavaScript SDK do: an action
  left out of the signature could be swapped for another.
- The credential scope must name the service ``sqs``, a region of ``JOBQ_AWS_REGIONS`` and the date of
  ``X-Amz-Date``.

The order: everything the headers decide (the Authorization header's form, the access key, the scope,
the signing time) is checked before a byte of the body is read (``before_body``), so a request without
valid credentials costs nothing however large its body; only the signature itself, which covers the
body's hash, waits for the body (``verify``), read up to a cap (app/sqs/router.py); the key's roles come
last (``permit``), once the action is known.

The errors are the ones AWS answers and SDKs know, all 403: MissingAuthenticationToken (no signature),
IncompleteSignature (a malformed Authorization or X-Amz-Date), InvalidClientTokenId (unknown access key),
SignatureDoesNotMatch (a wrong signature, an unsigned header that must be signed, a scope of another
service or region, a body that is not the one hashed), RequestExpired (a signing time more than 15
minutes off), AccessDenied (a role that may not do this).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import Request

from app.core.access import Grant, Role
from app.settings import AwsCredential
from app.sqs.protocol import SqsError, name_from_arn, name_from_url

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60  # seconds between the signing time and now, either way
HASHED_ON_THE_LOOP = 64 * 1024  # bytes of body hashed on the event loop; a larger one is hashed in a thread

# What each role's key may call; admins call everything. A Celery worker's key is producer and worker:
# a retry (self.retry) is a SendMessage from the worker.
_READ = {
    "GetQueueUrl",
    "ListQueues",
    "GetQueueAttributes",
    "ListDeadLetterSourceQueues",
    "ListMessageMoveTasks",
    "ListQueueTags",
}
ROLES: dict[Role, set[str]] = {
    Role.VIEWER: _READ,
    Role.PRODUCER: _READ | {"CreateQueue", "SendMessage", "SendMessageBatch"},
    Role.WORKER: _READ
    | {
        "CreateQueue",
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


def canonical_request(request: Request, signed_headers: list[str], payload: str) -> str:
    """``payload`` is the body's SHA-256 as computed here (never the client's claim)."""
    query = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in request.query_params.multi_items()
    )
    # A header sent twice is signed as its values joined by commas (SigV4's rule), so a second copy
    # added to a signed request changes what is signed.
    headers = "".join(
        f"{name}:{','.join(' '.join(v.split()) for v in request.headers.getlist(name))}\n"
        for name in signed_headers
    )
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


def _must_sign(request: Request) -> list[str]:
    """The headers a signature must cover: host and the date always, and the action and the content type
    when sent, since an unsigned one could be changed in a replay (ListQueues replayed as DeleteQueue)."""
    return ["host", "x-amz-date"] + [h for h in ("x-amz-target", "content-type") if h in request.headers]


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request's headers say of its signature, checked as far as they can be without the body."""

    credential: AwsCredential
    scope: str  # date/region/service/aws4_request
    scope_parts: tuple[str, str, str]  # date, region, service: what the signing key is derived from
    signed_headers: list[str]
    amz_date: str
    signature: str


def before_body(request: Request) -> Signed | None:
    """Everything about a request's credentials that its headers decide, checked before a byte of its body
    is read: the Authorization header's form, the access key, the credential scope (service, region, date)
    and the signing time. Only the signature itself needs the body, whose hash it covers (``verify``).
    None when signatures are not required."""
    settings = request.app.state.settings
    if not request.app.state.tokens and not settings.aws_credentials:
        return None
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
    credential = settings.aws_credentials.get(key_id)
    if credential is None:
        raise _denied("InvalidClientTokenId", "The security token included in the request is invalid.")
    if service != "sqs":
        raise _denied("SignatureDoesNotMatch", "Credential should be scoped to correct service: 'sqs'.")
    if region not in settings.aws_regions:
        raise _denied(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to a valid region, not '{region}'"
            f" (this service serves {', '.join(settings.aws_regions) or 'none'}: JOBQ_AWS_REGIONS).",
        )
    signed_headers = match["signed"].split(";")
    for name in _must_sign(request):
        if name not in signed_headers:
            raise _denied("SignatureDoesNotMatch", f"'{name}' must be a SignedHeader in the Authorization.")
    amz_date = request.headers.get("x-amz-date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise _denied("IncompleteSignature", "X-Amz-Date is missing or malformed.") from exc
    if amz_date[:8] != date:
        raise _denied(
            "SignatureDoesNotMatch", "The date of the Credential scope does not match the date of X-Amz-Date."
        )
    if abs((datetime.now(UTC) - when).total_seconds()) > MAX_SKEW:
        raise _denied("RequestExpired", "Signature expired: the signing time is more than 15 minutes off.")
    return Signed(
        credential,
        f"{date}/{region}/{service}/aws4_request",
        (date, region, service),
        signed_headers,
        amz_date,
        match["signature"],
    )


async def verify(request: Request, signed: Signed | None, body: bytes) -> Grant | None:
    """The signing key's Grant once the signature matches the request and its body (None when signatures
    are not required). A large body is hashed in a thread (hashlib lets go of the GIL), so a request
    signed with a made-up signature costs the event loop no more than a small one."""
    if signed is None:
        return None
    if len(body) > HASHED_ON_THE_LOOP:
        payload = await asyncio.to_thread(_sha256, body)
    else:
        payload = _sha256(body)
    claimed = request.headers.get("x-amz-content-sha256")
    if claimed is not None and claimed != payload:
        raise _denied(
            "SignatureDoesNotMatch",
            "SQS signs the body itself: the provided 'x-amz-content-sha256' header (UNSIGNED-PAYLOAD"
            " included) does not match the SHA-256 of the body.",
        )
    digest = hashlib.sha256(canonical_request(request, signed.signed_headers, payload).encode()).hexdigest()
    string_to_sign = f"{ALGORITHM}\n{signed.amz_date}\n{signed.scope}\n{digest}"
    expected = hmac.new(
        signing_key(signed.credential.secret, *signed.scope_parts), string_to_sign.encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, signed.signature):
        raise _denied(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )
    return signed.credential.grant


def permit(grant: Grant, action: str) -> None:
    """AccessDenied unless the key's roles may call `action`."""
    if Role.ADMIN not in grant.roles and not any(action in ROLES[role] for role in grant.roles):
        held = ", ".join(role for role in Role if role in grant.roles)
        raise _denied("AccessDenied", f"A key of role {held} may not call {action}.")


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _named_queues(body: dict) -> list[str]:
    """The queues a request names: by QueueUrl, QueueName, SourceArn or DestinationArn. One that is
    malformed is left to the action, which refuses it with the same error it always gives."""
    names = []
    for field, name_of in (
        ("QueueUrl", name_from_url),
        ("QueueName", lambda value: value),
        ("SourceArn", lambda value: name_from_arn(value, "SourceArn")),
        ("DestinationArn", lambda value: name_from_arn(value, "DestinationArn")),
    ):
        value = body.get(field)
        if isinstance(value, str) and value:
            try:
                names.append(name_of(value))
            except SqsError:
                continue
    return names


def admit(grant: Grant, body: dict) -> None:
    """AccessDenied unless every queue the request names is among the key's queues. The queues that
    an action finds by itself (a move task's source queues, a ListQueues page) or reads from inside
    an attribute (a RedrivePolicy's deadLetterTargetArn, once the action has parsed it) are the
    action's to check or filter, with ``Context.grant`` (app/sqs/context.py) and ``admit_queue``."""
    if grant.queues is None:
        return
    for name in _named_queues(body):
        admit_queue(grant, name)


def admit_queue(grant: Grant, name: str) -> None:
    """AccessDenied unless `name` is among the key's queues."""
    if not grant.admits(name):
        raise denied_queue(grant, name)


def denied_queue(grant: Grant, name: str) -> SqsError:
    assert grant.queues is not None
    return _denied(
        "AccessDenied",
        f"This key may not use queue {name}: it is limited to queues matching {', '.join(grant.queues)}.",
    )
