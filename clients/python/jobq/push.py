"""Push delivery, on the receiving end. The service POSTs each job of a queue configured with a push URL
to that URL, signed as Standard Webhooks specifies (https://www.standardwebhooks.com); `verify_push`
checks such a request and returns its job, and `sign_push` makes the headers the service would send with
a body, for testing a receiver.

A request's body is the job as JSON (`jobq.types.PushedJob`); its headers:
- `webhook-id`: `job_<id>`, the same on every attempt, so that a receiver can tell a job it has done
  already (its answer lost, say) from a new one;
- `webhook-timestamp`: when it was sent, in Unix seconds;
- `webhook-signature`: `v1,` and the base64 of the HMAC-SHA256 of `<webhook-id>.<webhook-timestamp>.<body>`,
  keyed with the bytes of the queue's secret (`whsec_` and their base64); while the secret is rotated,
  one such signature per secret, space-separated;
- `jobq-attempt`: which attempt this is; `traceparent`, when the job has one.

The receiver's answer settles the job: a 2xx completes it (a JSON body becomes its result); a 429 or 503
with `Retry-After: <seconds>` puts it back for then, the attempt not counted; anything else fails the
attempt (the job is retried after the queue's backoff while attempts remain, then dead).

Only the standard library: a receiver needs none of the client's dependencies to use this module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import cast

from jobq.types import PushedJob, PushVerificationError

_PREFIX = "whsec_"
_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def verify_push(
    headers: Mapping[str, str], body: bytes | str, secret: str, *, tolerance: float = 300
) -> PushedJob:
    """The job a push request carries, once its signature is checked against `secret` (the queue's,
    `whsec_` and base64): `headers` are the request's, any mapping of names to values (Starlette's
    `request.headers`, a dict such as AWS Lambda's `event["headers"]`; names in any case), and `body` is
    the raw body exactly as received, bytes or str (not JSON parsed and serialized again: the signature
    covers the bytes).

    The request must carry `webhook-id`, `webhook-timestamp` and `webhook-signature`; its timestamp must
    be within `tolerance` seconds of this machine's clock, either way (a request replayed later fails);
    one `v1` signature among those of `webhook-signature` must match (compared in constant time); the
    body must be a JSON object. Else PushVerificationError, saying which. The body's fields are not
    checked further: a field the service adds later is there too."""
    try:
        key = _key(secret)
    except ValueError as exc:
        raise PushVerificationError(str(exc)) from None
    found = {name.lower(): value for name, value in headers.items()}
    webhook_id, timestamp, signatures = ((found.get(name) or "").strip() for name in _HEADERS)
    for name, value in zip(_HEADERS, (webhook_id, timestamp, signatures), strict=True):
        if not value:
            raise PushVerificationError(
                f"missing header {name}: not a push request signed as Standard Webhooks (or a proxy on the "
                "way dropped the header)"
            )

    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise PushVerificationError(f"webhook-timestamp {timestamp[:40]!r} is not a time in Unix seconds")
    off = time.time() - int(timestamp)
    if abs(off) > tolerance:
        when = "old" if off > 0 else "ahead of this machine's clock"
        raise PushVerificationError(
            f"webhook-timestamp is {abs(off):.0f} s {when}, more than the {tolerance:g} s allowed either "
            "way: a request replayed or held up, or a clock that is wrong (this machine's or the service's)"
        )

    payload = _bytes(body)
    expected = _signature(key, webhook_id, timestamp, payload).encode()
    schemes: list[str] = []
    for entry in signatures.split():
        schemes.append(entry.partition(",")[0])
        if hmac.compare_digest(entry.encode(), expected):  # the scheme too: v1, then the signature
            break
    else:
        if "v1" not in schemes:
            raise PushVerificationError(
                f"webhook-signature has no v1 signature (schemes: {', '.join(sorted(set(schemes)))[:100]}); "
                "jobq signs with v1, HMAC-SHA256"
            )
        raise PushVerificationError(
            "no signature matched the secret: the secret is not the queue's (or not its current one), or "
            "the body is not the one signed (pass the raw body, exactly as received)"
        )

    try:
        job = json.loads(payload)
    except ValueError:
        raise PushVerificationError("the body is not JSON, though its signature matched") from None
    if not isinstance(job, dict):
        raise PushVerificationError(f"the body is JSON but not an object ({type(job).__name__})")
    return cast(PushedJob, job)


def sign_push(
    body: bytes | str, secret: str, *, webhook_id: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    """The headers the service sends with `body` to a push URL, signed with `secret` (`whsec_` and
    base64): `content-type`, `webhook-id` (`webhook_id`; None: `job_` and the body's `id`),
    `webhook-timestamp` (`timestamp`, Unix seconds; None: now) and `webhook-signature`. For testing a
    receiver with requests it must take as the service's. ValueError when the secret is not in `whsec_`
    form, or when `webhook_id` is None and the body is not a JSON object with an `id`."""
    key = _key(secret)
    payload = _bytes(body)
    if webhook_id is None:
        try:
            webhook_id = f"job_{json.loads(payload)['id']}"
        except (ValueError, TypeError, KeyError):
            raise ValueError("the body is not a JSON object with an id: pass webhook_id") from None
    sent = str(int(time.time()) if timestamp is None else timestamp)
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": sent,
        "webhook-signature": _signature(key, webhook_id, sent, payload),
    }


def _key(secret: str) -> bytes:
    """The key a secret stands for: the bytes of its base64, after `whsec_`. The messages never show the
    secret."""
    if not isinstance(secret, str):
        raise ValueError(f"the secret is a {type(secret).__name__}, not a str: whsec_ and base64")
    secret = secret.strip()
    if not secret.startswith(_PREFIX):
        raise ValueError("the secret is not in whsec_ form (whsec_ and base64): pass the queue's as given")
    encoded = secret[len(_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValueError("the secret is not in whsec_ form: what follows whsec_ is not base64") from None
    if not key:
        raise ValueError("the secret is empty: nothing follows whsec_")
    return key


def _bytes(body: bytes | str) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"the body is a {type(body).__name__}: pass the raw body, bytes or str")


def _signature(key: bytes, webhook_id: str, timestamp: str, payload: bytes) -> str:
    """`v1,` and the base64 of the HMAC-SHA256 of `<webhook-id>.<timestamp>.<payload>`."""
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + payload, hashlib.sha256).digest()
    return f"v1,{base64.b64encode(digest).decode()}"
