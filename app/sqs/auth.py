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
  ``X-Amz-Date``. The region is the one the request acts in (app/sqs/regions.py): a signature for one
  region cannot reach another's queues.

A GET (the Query protocol with its parameters in the URL) may carry its signature in its URL instead of
an Authorization header, as a presigned URL does (AWS's query-string authentication):
``X-Amz-Algorithm``, ``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-Expires``, ``X-Amz-SignedHeaders``
and ``X-Amz-Signature``, each once. It is checked as fully as a header: the same credential scope, the
signature over the method, the path, every parameter of the URL but ``X-Amz-Signature`` (the action and
all its parameters among them), the signed headers (``host`` always, ``x-amz-target`` and
``content-type`` when sent) and the body's hash (of nothing, for a GET; ``UNSIGNED-PAYLOAD``, which
botocore's S3 signer puts there, is taken only for an empty body, where it leaves nothing unsigned). It
is valid from 15 minutes before its X-Amz-Date until X-Amz-Expires seconds after it (1 to 604800, a
week, as AWS allows), and refused after that (RequestExpired): a leaked URL stops working when it was
meant to. A request signed both ways is refused: which one to check would be the attacker's choice.

The order: everything the headers decide (the Authorization header's form, the access key, the scope,
the signing time) is checked before a byte of the body is read (``before_body``), so a request without
valid credentials costs nothing however large its body; only the signature itself, which covers the
body's hash, waits for the body (``verify``), read up to a cap (app/sqs/router.py); the key's roles come
last (``permit``), once the action is known.

The errors are the ones AWS answers and SDKs know, all 403: MissingAuthenticationToken (no signature),
IncompleteSignature (a malformed Authorization or X-Amz-Date, a presigned URL missing one of its
parameters or with an X-Amz-Expires out of bounds), InvalidClientTokenId (unknown access key),
SignatureDoesNotMatch (a wrong signature, an unsigned header that must be signed, a scope of another
service or region, a body that is not the one hashed), RequestExpired (a signing time more than 15
minutes off, a presigned URL past its expiry), AccessDenied (a role that may not do this).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import Request

from app.core.access import Grant, Role
from app.settings import AwsCredential
from app.sqs.context import Context
from app.sqs.protocol import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60  # seconds between the signing time and now, either way
MAX_EXPIRES = 7 * 24 * 3600  # the longest X-Amz-Expires of a presigned URL, as AWS allows: a week
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# A presigned URL's parameters; all but the signature are signed, as part of the canonical query string.
SIGNATURE_PARAMETER = "X-Amz-Signature"
_QUERY_AUTH = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    SIGNATURE_PARAMETER,
)
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
_CREDENTIAL = re.compile(r"Credential=([^,\s]+)")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_SIGNED_HEADERS = re.compile(r"[a-z0-9-]+(?:;[a-z0-9-]+)*")
_EXPIRES = re.compile(r"[0-9]{1,6}")


def _denied(code: str, message: str) -> SqsError:
    return SqsError(code, message, status=403)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def canonical_request(
    request: Request, signed_headers: list[str], payload: str, *, presigned: bool = False
) -> str:
    """``payload`` is the body's SHA-256 as computed here (never the client's claim). A presigned request's
    canonical query string leaves out its X-Amz-Signature, the one parameter that cannot sign itself."""
    query = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~"))
        for k, v in request.query_params.multi_items()
        if not (presigned and k == SIGNATURE_PARAMETER)
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


def _must_sign(request: Request, *, presigned: bool = False) -> list[str]:
    """The headers a signature must cover: host and the date always (a presigned URL's date is one of its
    parameters, signed with them), and the action and the content type when sent, since an unsigned one
    could be changed in a replay (ListQueues replayed as DeleteQueue)."""
    dated = [] if presigned else ["x-amz-date"]
    return ["host", *dated] + [h for h in ("x-amz-target", "content-type") if h in request.headers]


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request's headers say of its signature, checked as far as they can be without the body."""

    credential: AwsCredential
    scope: str  # date/region/service/aws4_request
    scope_parts: tuple[str, str, str]  # date, region, service: what the signing key is derived from
    signed_headers: list[str]
    amz_date: str
    signature: str
    presigned: bool = False  # signed in the URL (X-Amz-Signature), not in an Authorization header


def checks_signatures(state: Any) -> bool:
    """Whether the service (its app's `state`) requires signed requests: it has keys or tokens."""
    return bool(state.tokens or state.settings.aws_credentials)


def before_body(request: Request) -> Signed | None:
    """Everything about a request's credentials that its headers and URL decide, checked before a byte of
    its body is read: the Authorization header's form (or a presigned URL's parameters), the access key,
    the credential scope (service, region, date) and the signing time. Only the signature itself needs
    the body, whose hash it covers (``verify``). None when signatures are not required."""
    if not checks_signatures(request.app.state):
        return None
    if request.method == "GET" and any(name in request.query_params for name in _QUERY_AUTH):
        if "authorization" in request.headers:
            raise _denied(
                "IncompleteSignature",
                "Sign a request once: in its Authorization header or in its URL (X-Amz-Signature), not both.",
            )
        return _presigned(request)
    return _signed_in_headers(request)


def _signed_in_headers(request: Request) -> Signed:
    """A request signed in its Authorization header, dated by its X-Amz-Date header, within MAX_SKEW of
    now."""
    match = _AUTHORIZATION.match(request.headers.get("authorization", "").strip())
    if match is None:
        raise _denied(
            "MissingAuthenticationToken",
            "Requests must be signed with AWS Signature Version 4 (an access key id and secret).",
        )
    what = "The Credential of the Authorization header"
    credential, scope = _credential(request, match["credential"], what)
    signed_headers = match["signed"].split(";")
    _check_signed(request, signed_headers, presigned=False, where="the Authorization")
    amz_date = request.headers.get("x-amz-date", "")
    when = _signing_time(amz_date, scope[0])
    if abs((datetime.now(UTC) - when).total_seconds()) > MAX_SKEW:
        raise _denied("RequestExpired", "Signature expired: the signing time is more than 15 minutes off.")
    return Signed(credential, _scope_text(scope), scope, signed_headers, amz_date, match["signature"])


def _presigned(request: Request) -> Signed:
    """A request signed in its URL: each of the query-string authentication's parameters once, valid from
    MAX_SKEW before its X-Amz-Date until X-Amz-Expires seconds after it."""
    given = {name: request.query_params.getlist(name) for name in _QUERY_AUTH}
    missing = [name for name, values in given.items() if len(values) != 1]
    if missing:
        raise _denied(
            "IncompleteSignature",
            f"A presigned request must carry each of {', '.join(_QUERY_AUTH)} once;"
            f" not so: {', '.join(missing)}.",
        )
    value = {name: values[0] for name, values in given.items()}
    if value["X-Amz-Algorithm"] != ALGORITHM:
        raise _denied("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}.")
    if not _SIGNATURE.fullmatch(value[SIGNATURE_PARAMETER]):
        raise _denied("IncompleteSignature", "X-Amz-Signature must be 64 lowercase hexadecimal digits.")
    if not _SIGNED_HEADERS.fullmatch(value["X-Amz-SignedHeaders"]):
        raise _denied("IncompleteSignature", "X-Amz-SignedHeaders is malformed.")
    credential, scope = _credential(request, value["X-Amz-Credential"], "X-Amz-Credential")
    signed_headers = value["X-Amz-SignedHeaders"].split(";")
    _check_signed(request, signed_headers, presigned=True, where="X-Amz-SignedHeaders")
    expires = value["X-Amz-Expires"]
    if not _EXPIRES.fullmatch(expires) or not 1 <= int(expires) <= MAX_EXPIRES:
        raise _denied(
            "IncompleteSignature",
            f"X-Amz-Expires must be a number of seconds from 1 to {MAX_EXPIRES} (a week), not {expires!r}.",
        )
    amz_date = value["X-Amz-Date"]
    when = _signing_time(amz_date, scope[0])
    age = (datetime.now(UTC) - when).total_seconds()
    if age < -MAX_SKEW:
        raise _denied(
            "RequestExpired", "Signature not yet current: X-Amz-Date is more than 15 minutes ahead."
        )
    if age > int(expires):
        raise _denied(
            "RequestExpired",
            f"Request has expired: it was valid for {expires} seconds from {amz_date} (X-Amz-Expires).",
        )
    return Signed(
        credential, _scope_text(scope), scope, signed_headers, amz_date, value[SIGNATURE_PARAMETER], True
    )


def _credential(request: Request, text: str, what: str) -> tuple[AwsCredential, tuple[str, str, str]]:
    """The access key a Credential (``<key>/<date>/<region>/sqs/aws4_request``) names, and its scope's
    date, region and service, once the scope names ``sqs`` and a region of ``JOBQ_AWS_REGIONS``. `what`
    names the Credential where an error quotes it."""
    settings = request.app.state.settings
    parts = text.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise _denied("IncompleteSignature", f"{what} is malformed.")
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
    return credential, (date, region, service)


def _check_signed(request: Request, signed_headers: list[str], *, presigned: bool, where: str) -> None:
    """SignatureDoesNotMatch unless the signature covers every header it must (``_must_sign``)."""
    for name in _must_sign(request, presigned=presigned):
        if name not in signed_headers:
            raise _denied("SignatureDoesNotMatch", f"'{name}' must be a SignedHeader in {where}.")


def _signing_time(amz_date: str, scope_date: str) -> datetime:
    """The time an X-Amz-Date (``20240102T030405Z``) says, which must fall on the credential scope's date."""
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise _denied("IncompleteSignature", "X-Amz-Date is missing or malformed.") from exc
    if amz_date[:8] != scope_date:
        raise _denied(
            "SignatureDoesNotMatch", "The date of the Credential scope does not match the date of X-Amz-Date."
        )
    return when


def signing_region(request: Request, signed: Signed | None) -> str | None:
    """The region a request is signed for (app/sqs/regions.py): its checked credential scope's, or on a
    service that checks no signatures, the one its Authorization header's or URL's Credential names, read
    and not checked; None for an unsigned request."""
    if signed is not None:
        return signed.scope_parts[1]
    given = _CREDENTIAL.search(request.headers.get("authorization", ""))
    credential = given[1] if given else request.query_params.get("X-Amz-Credential", "")
    parts = credential.split("/")
    return parts[2] if len(parts) == 5 and parts[2] else None


def _scope_text(scope: tuple[str, str, str]) -> str:
    return "/".join((*scope, "aws4_request"))


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
    # A presigned URL of an empty body may say UNSIGNED-PAYLOAD for it: there is nothing it leaves unsigned.
    payloads = [payload, UNSIGNED_PAYLOAD] if signed.presigned and not body else [payload]
    if not any(hmac.compare_digest(_signature(request, signed, p), signed.signature) for p in payloads):
        raise _denied(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )
    return signed.credential.grant


def _signature(request: Request, signed: Signed, payload: str) -> str:
    """The signature of `request` with the body's hash `payload`, by the key and scope `signed` names."""
    canonical = canonical_request(request, signed.signed_headers, payload, presigned=signed.presigned)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    string_to_sign = f"{ALGORITHM}\n{signed.amz_date}\n{signed.scope}\n{digest}"
    return hmac.new(
        signing_key(signed.credential.secret, *signed.scope_parts), string_to_sign.encode(), hashlib.sha256
    ).hexdigest()


def permit(grant: Grant, action: str) -> None:
    """AccessDenied unless the key's roles may call `action`."""
    if Role.ADMIN not in grant.roles and not any(action in ROLES[role] for role in grant.roles):
        held = ", ".join(role for role in Role if role in grant.roles)
        raise _denied("AccessDenied", f"A key of role {held} may not call {action}.")


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _named_queues(body: dict, ctx: Context) -> list[str]:
    """The queues a request names, in its region: by QueueUrl, QueueName, SourceArn or DestinationArn.
    One that is malformed, or of another region, is left to the action, which refuses it with the same
    error it always gives."""
    names = []
    for field, name_of in (
        ("QueueUrl", ctx.of_url),
        ("QueueName", ctx.named),
        ("SourceArn", lambda value: ctx.of_arn(value, "SourceArn")),
        ("DestinationArn", lambda value: ctx.of_arn(value, "DestinationArn")),
    ):
        value = body.get(field)
        if isinstance(value, str) and value:
            try:
                names.append(name_of(value))
            except SqsError:
                continue
    return names


def admit(ctx: Context, body: dict) -> None:
    """AccessDenied unless every queue the request names is among the key's queues. The queues that
    an action finds by itself (a move task's source queues, a ListQueues page) or reads from inside
    an attribute (a RedrivePolicy's deadLetterTargetArn, once the action has parsed it) are the
    action's to check or filter, with ``Context.grant`` (app/sqs/context.py) and ``admit_queue``."""
    if ctx.grant.queues is None:
        return
    for name in _named_queues(body, ctx):
        admit_queue(ctx.grant, name)


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
