"""Push delivery's signatures (jobq/push.py), against Standard Webhooks' own library: what it signs,
`verify_push` takes, and what `sign_push` signs, it takes; a body, secret, header, timestamp or scheme
that is not the signed one is refused with PushVerificationError, saying which."""

from __future__ import annotations

import base64
import json
import re
import secrets
from datetime import UTC, datetime, timedelta

import pytest
import standardwebhooks
from starlette.datastructures import Headers

import jobq
from jobq import PushVerificationError, sign_push, verify_push

# Fixed, not drawn: test ids are made from them, and every test process must collect the same ids.
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OTHER = "whsec_" + base64.b64encode(bytes(range(32, 64))).decode()
JOB = {
    "id": 42,
    "queue": "emails",
    "kind": "send_email",
    "key": None,
    "payload": {"to": "ada@example.com", "subject": "Grüße"},
    "attempts": 1,
    "max_attempts": 5,
    "run_at": "2026-11-23T10:00:00+00:00",
    "created_at": "2026-11-23T09:59:58.123456+00:00",
    "parents": [{"id": 41, "kind": "render", "status": "completed", "result": {"html": "<p>Hi</p>"}}],
}
BODY = json.dumps(JOB, ensure_ascii=False).encode()


def signed(
    body: bytes | str = BODY, secret: str = SECRET, *, webhook_id: str = "job_42", at: datetime | None = None
) -> dict[str, str]:
    """The three headers, signed by the standardwebhooks library."""
    at = at or datetime.now(UTC)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(secret).sign(webhook_id, at, body),
    }


def refused(headers: dict[str, str], body: bytes | str = BODY, secret: str = SECRET, **kwargs: float) -> str:
    """The message `verify_push` refuses the request with."""
    with pytest.raises(PushVerificationError) as raised:
        verify_push(headers, body, secret, **kwargs)
    return str(raised.value)


def test_a_request_the_library_signed_verifies_and_gives_its_job():
    assert verify_push(signed(), BODY, SECRET) == JOB
    assert verify_push(signed(BODY.decode()), BODY.decode(), SECRET) == JOB  # a str body, as UTF-8


@pytest.mark.parametrize(
    "spell",
    [
        lambda h: {name.title(): value for name, value in h.items()},  # Webhook-Id, as API Gateway may
        lambda h: {name.upper(): value for name, value in h.items()},
        lambda h: Headers(headers={name.title(): value for name, value in h.items()}),  # Starlette's
    ],
    ids=["title", "upper", "starlette"],
)
def test_header_names_are_read_in_any_case(spell):
    assert verify_push(spell(signed()), BODY, SECRET)["id"] == 42


def test_a_secret_without_its_base64_padding_is_the_same_secret():
    unpadded = SECRET.rstrip("=")
    assert unpadded != SECRET
    assert verify_push(signed(secret=SECRET), BODY, unpadded) == JOB


def test_a_body_changed_by_one_byte_is_refused():
    tampered = BODY.replace(b'"emails"', b'"emailz"')
    assert tampered != BODY
    assert refused(signed(), tampered).startswith("no signature matched the secret")
    # Parsed and serialized again, the same JSON is other bytes: the raw body is what was signed.
    assert refused(signed(), json.dumps(JOB)).startswith("no signature matched the secret")


def test_a_signature_of_another_secret_is_refused():
    assert refused(signed(secret=OTHER)).startswith("no signature matched the secret")
    assert refused(signed(), secret=OTHER).startswith("no signature matched the secret")


def test_the_signature_covers_the_id_and_the_timestamp():
    headers = signed()
    assert refused({**headers, "webhook-id": "job_43"}).startswith("no signature matched")
    later = str(int(headers["webhook-timestamp"]) + 1)
    assert refused({**headers, "webhook-timestamp": later}).startswith("no signature matched")


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_or_empty_header_is_refused_by_its_name(name):
    headers = signed()
    del headers[name]
    assert refused(headers).startswith(f"missing header {name}:")
    assert refused({**headers, name: " "}).startswith(f"missing header {name}:")


@pytest.mark.parametrize("seconds", [-400, 400, -86_400])
def test_a_timestamp_more_than_the_tolerance_from_now_is_refused(seconds):
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    message = refused(signed(at=at))
    assert "more than the 300 s allowed either way" in message
    assert ("ahead of this machine's clock" in message) == (seconds > 0)
    off = re.match(r"webhook-timestamp is (\d+) s ", message)
    assert off and abs(int(off[1]) - abs(seconds)) <= 1, message  # the header is in whole seconds


def test_a_timestamp_within_the_tolerance_verifies_and_the_tolerance_is_the_caller_s():
    at = datetime.now(UTC) - timedelta(seconds=200)
    assert verify_push(signed(at=at), BODY, SECRET)["id"] == 42
    assert "more than the 100 s allowed" in refused(signed(at=at), tolerance=100)
    assert verify_push(signed(at=at - timedelta(seconds=3000)), BODY, SECRET, tolerance=3600)["id"] == 42


@pytest.mark.parametrize("timestamp", ["12.5", "soon", "-1", "1e9", "٣٣٣"])
def test_a_timestamp_not_in_whole_unix_seconds_is_refused(timestamp):
    message = refused({**signed(), "webhook-timestamp": timestamp})
    assert message == f"webhook-timestamp {timestamp!r} is not a time in Unix seconds"


def test_a_signature_of_another_scheme_is_not_taken_for_v1():
    right = signed()["webhook-signature"]
    assert right.startswith("v1,")
    for scheme in ("v1a", "v2", "V1", ""):
        message = refused({**signed(), "webhook-signature": f"{scheme}{right[2:]}"})
        assert message.startswith("webhook-signature has no v1 signature"), message
    message = refused({**signed(), "webhook-signature": f"v1a{right[2:]} v2,abc"})
    assert "(schemes: v1a, v2)" in message


def test_one_matching_signature_among_several_is_enough():
    """During a rotation the service signs with the old secret and the new one: a receiver with either
    takes the request, wherever its signature stands among the others."""
    at = datetime.now(UTC)
    old, new = signed(secret=OTHER, at=at), signed(secret=SECRET, at=at)
    both = f"{old['webhook-signature']} {new['webhook-signature']}"
    for signatures in (both, f"v1a,{'A' * 86} {both}", f"{new['webhook-signature']}  v1,AAAA"):
        assert verify_push({**new, "webhook-signature": signatures}, BODY, SECRET) == JOB
    assert verify_push({**old, "webhook-signature": both}, BODY, OTHER) == JOB
    third = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    assert refused({**new, "webhook-signature": both}, secret=third).startswith("no signature matched")


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        (SECRET.removeprefix("whsec_"), "the secret is not in whsec_ form"),
        ("whsec_not*base64!", "what follows whsec_ is not base64"),
        ("whsec_", "the secret is empty"),
        (None, "the secret is a NoneType, not a str"),  # os.environ.get of a variable not set
    ],
)
def test_a_secret_not_in_whsec_form_is_refused_without_showing_it(secret, says):
    message = refused(signed(), secret=secret)
    assert says in message, message
    shown = (secret or "").removeprefix("whsec_")
    assert not shown or shown not in message


def test_a_signed_body_that_is_not_a_json_object_is_refused():
    for body, says in (
        (b"[1, 2]", "the body is JSON but not an object (list)"),
        (b"{", "the body is not JSON"),
    ):
        assert refused(signed(body), body).startswith(says)


def test_what_sign_push_signs_the_library_verifies():
    headers = sign_push(BODY, SECRET)
    assert headers["webhook-id"] == "job_42"  # from the body's id
    assert headers["content-type"] == "application/json"
    assert standardwebhooks.Webhook(SECRET).verify(BODY, headers) == JOB
    assert verify_push(headers, BODY, SECRET) == JOB
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(OTHER).verify(BODY, headers)


def test_sign_push_signs_as_the_library_does():
    at = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
    headers = sign_push(BODY.decode(), SECRET, webhook_id="msg_x", timestamp=int(at.timestamp()))
    assert headers["webhook-timestamp"] == "1795428000"
    assert headers["webhook-signature"] == standardwebhooks.Webhook(SECRET).sign("msg_x", at, BODY)


def test_sign_push_needs_an_id_from_somewhere():
    with pytest.raises(ValueError, match="pass webhook_id"):
        sign_push(b"[1]", SECRET)
    assert sign_push(b"[1]", SECRET, webhook_id="msg_1")["webhook-id"] == "msg_1"


def test_the_error_is_a_value_error_not_a_jobq_error():
    assert issubclass(PushVerificationError, ValueError)
    assert not issubclass(PushVerificationError, jobq.JobqError)
