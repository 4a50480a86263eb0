"""SQS requests signed with AWS Signature Version 4 (botocore's signer) once jobq has tokens."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.sqs.clients import PROTOCOLS, make_client, query_client, query_model  # noqa: F401 - a fixture
from tests.waiting import equals, states, until

CREDENTIALS = {
    "AKIAADMIN": {"secret": "admin-secret", "role": "admin"},
    "AKIAPRODUCER": {"secret": "producer-secret", "role": "producer"},
}


def client(
    url: str, key: str = "AKIAADMIN", secret: str = "admin-secret", region: str = "eu-west-1", **config
):
    return make_client(
        url, key=key, secret=secret, region=region, config=Config(retries={"max_attempts": 1}, **config)
    )


@pytest.fixture
def secured(start_service):
    return start_service(
        tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS, aws_regions=["eu-west-1"]
    )


def code_and_status(call, **kwargs) -> tuple[str, int]:
    with pytest.raises(ClientError) as exc:
        call(**kwargs)
    return exc.value.response["Error"]["Code"], exc.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_signed_requests_pass_and_others_are_refused(secured):
    admin = client(secured.url)
    url = admin.create_queue(QueueName="secure")["QueueUrl"]
    admin.send_message(QueueUrl=url, MessageBody="signed")
    (message,) = admin.receive_message(QueueUrl=url)["Messages"]
    admin.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    unsigned = client(secured.url, signature_version=UNSIGNED)
    assert code_and_status(unsigned.list_queues) == ("MissingAuthenticationToken", 403)
    unknown = client(secured.url, key="AKIANOBODY")
    assert code_and_status(unknown.list_queues) == ("InvalidClientTokenId", 403)
    wrong = client(secured.url, secret="not-the-secret")
    assert code_and_status(wrong.send_message, QueueUrl=url, MessageBody="x") == (
        "SignatureDoesNotMatch",
        403,
    )

    producer = client(secured.url, key="AKIAPRODUCER", secret="producer-secret")
    producer.send_message(QueueUrl=url, MessageBody="from a producer")
    assert code_and_status(producer.receive_message, QueueUrl=url) == ("AccessDenied", 403)
    assert code_and_status(producer.purge_queue, QueueUrl=url) == ("AccessDenied", 403)
    assert admin.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "from a producer"
    # Tags and permissions are an admin's to change; anyone may read the tags.
    assert code_and_status(producer.tag_queue, QueueUrl=url, Tags={"k": "v"}) == ("AccessDenied", 403)
    assert code_and_status(
        producer.add_permission, QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["*"]
    ) == ("AccessDenied", 403)
    admin.tag_queue(QueueUrl=url, Tags={"k": "v"})
    assert producer.list_queue_tags(QueueUrl=url)["Tags"] == {"k": "v"}


def test_a_tampered_body_does_not_match_its_signature(secured):
    admin = client(secured.url)
    url = admin.create_queue(QueueName="tamper")["QueueUrl"]

    def tamper(request, **_):  # after signing, just before sending
        request.body = request.body.replace(b"honest", b"forged")

    admin.meta.events.register("before-send.sqs.SendMessage", tamper)
    assert code_and_status(admin.send_message, QueueUrl=url, MessageBody="honest") == (
        "SignatureDoesNotMatch",
        403,
    )


def test_without_tokens_signatures_are_not_required(service):
    unsigned = client(service.url, signature_version=UNSIGNED)
    assert unsigned.create_queue(QueueName="open")["QueueUrl"].endswith("/open")


# --- forgeries of a captured request (issue 12, point 1) -------------------------------------------
# A signer of our own (the few lines of SigV4 a client runs), so that each test can sign exactly what a
# careless client would and then change what an attacker replaying the request would change.

REGION = "eu-west-1"  # the region `regional` serves (and the boto3 clients above sign for)
JSON_TYPE = "application/x-amz-json-1.0"


def _key(secret: str, date: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    url: str,
    action: str,
    body: bytes,
    *,
    signed: tuple[str, ...] = ("content-type", "host", "x-amz-date", "x-amz-target"),
    content_sha256: bool = False,
    region: str = REGION,
    service: str = "sqs",
    key: str = "AKIAADMIN",
    secret: str = "admin-secret",
) -> dict[str, str]:
    """The headers of ``POST /`` calling ``action`` with ``body``, signed over the ``signed`` headers."""
    amz_date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    payload = hashlib.sha256(body).hexdigest()
    headers = {
        "host": urlsplit(url).netloc,
        "x-amz-date": amz_date,
        "x-amz-target": f"AmazonSQS.{action}",
        "content-type": JSON_TYPE,
    }
    if content_sha256:
        headers["x-amz-content-sha256"] = payload
    names = sorted(signed)
    canonical = "\n".join(
        ["POST", "/", "", "".join(f"{n}:{headers[n]}\n" for n in names), ";".join(names), payload]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = hmac.new(
        _key(secret, amz_date[:8], region, service), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def post(url: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    """Send ``POST /`` as given; the status and the SQS error code (``""`` on success), from a JSON
    error or, for a form's content type (the Query protocol), an XML one."""
    response = httpx.post(f"{url}/", content=body, headers=headers)
    if response.status_code < 400:
        return response.status_code, ""
    if response.headers["content-type"].startswith("text/xml"):
        return response.status_code, re.search("<Code>(.*?)</Code>", response.text)[1]
    return response.status_code, response.json().get("__type", "").rpartition("#")[2]


def send_body(queue_url: str, text: str) -> bytes:
    return json.dumps({"QueueUrl": queue_url, "MessageBody": text}).encode()


async def stored(db, queue: str) -> list[str]:
    rows = await db.fetch("SELECT payload FROM jobq.all_jobs WHERE queue = $1 ORDER BY id", queue)
    return [json.loads(r["payload"]) for r in rows]


@pytest.fixture
def regional(start_service):
    """A secured service that serves eu-west-1 only."""
    return start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS, aws_regions=[REGION])


@pytest.mark.anyio
async def test_our_signer_is_accepted_so_the_forgeries_below_are_refused_for_their_change(regional, db):
    url = client(regional.url).create_queue(QueueName="control")["QueueUrl"]
    for content_sha256 in (False, True):
        body = send_body(url, f"signed, header {content_sha256}")
        headers = sign(regional.url, "SendMessage", body, content_sha256=content_sha256)
        assert post(regional.url, headers, body) == (200, "")
    assert await stored(db, "control") == ["signed, header False", "signed, header True"]


@pytest.mark.anyio
async def test_a_body_swapped_under_its_content_sha256_header_is_refused(regional, db):
    url = client(regional.url).create_queue(QueueName="swap")["QueueUrl"]
    honest = send_body(url, "honest")
    headers = sign(regional.url, "SendMessage", honest, content_sha256=True)  # captured
    forged = send_body(url, "forged")
    assert post(regional.url, headers, forged) == (403, "SignatureDoesNotMatch")
    # An UNSIGNED-PAYLOAD header does not unsign it either: SQS always authenticates the body.
    headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    assert post(regional.url, headers, forged) == (403, "SignatureDoesNotMatch")
    assert await stored(db, "swap") == []
    headers = sign(regional.url, "SendMessage", honest, content_sha256=True)
    assert post(regional.url, headers, honest) == (200, "")
    assert await stored(db, "swap") == ["honest"]


@pytest.mark.anyio
async def test_an_unsigned_action_cannot_be_replayed_as_another(regional, db):
    url = client(regional.url).create_queue(QueueName="keep")["QueueUrl"]
    body = json.dumps({"QueueUrl": url}).encode()
    headers = sign(regional.url, "ListQueues", body, signed=("content-type", "host", "x-amz-date"))
    headers["x-amz-target"] = "AmazonSQS.DeleteQueue"
    assert post(regional.url, headers, body) == (403, "SignatureDoesNotMatch")
    # Signed, the action is covered by the signature like any signed header.
    headers = sign(regional.url, "ListQueues", body)
    headers["x-amz-target"] = "AmazonSQS.DeleteQueue"
    assert post(regional.url, headers, body) == (403, "SignatureDoesNotMatch")
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'keep'") == 1


@pytest.mark.anyio
async def test_an_unsigned_content_type_or_date_is_refused(regional, db):
    url = client(regional.url).create_queue(QueueName="typed")["QueueUrl"]
    body = send_body(url, "retyped")
    headers = sign(regional.url, "SendMessage", body, signed=("host", "x-amz-date", "x-amz-target"))
    headers["content-type"] = "application/x-www-form-urlencoded"
    assert post(regional.url, headers, body) == (403, "SignatureDoesNotMatch")
    undated = sign(regional.url, "SendMessage", body, signed=("content-type", "host", "x-amz-target"))
    assert post(regional.url, undated, body) == (403, "SignatureDoesNotMatch")
    assert await stored(db, "typed") == []


@pytest.mark.anyio
async def test_the_credential_scope_must_name_sqs_and_a_region_served_here(regional, db):
    url = client(regional.url).create_queue(QueueName="scoped")["QueueUrl"]
    body = send_body(url, "out of scope")
    assert post(regional.url, sign(regional.url, "SendMessage", body, service="s3"), body) == (
        403,
        "SignatureDoesNotMatch",
    )
    assert post(regional.url, sign(regional.url, "SendMessage", body, region="us-west-2"), body) == (
        403,
        "SignatureDoesNotMatch",
    )
    assert code_and_status(client(regional.url, region="us-west-2").list_queues) == (
        "SignatureDoesNotMatch",
        403,
    )
    assert await stored(db, "scoped") == []


@pytest.mark.anyio
async def test_credentials_are_enforced_without_tokens(start_service, db):
    service = start_service(aws_credentials=CREDENTIALS, aws_regions=[REGION])
    admin = client(service.url)
    url = admin.create_queue(QueueName="keyed")["QueueUrl"]
    unsigned = client(service.url, signature_version=UNSIGNED)
    assert code_and_status(unsigned.send_message, QueueUrl=url, MessageBody="anonymous") == (
        "MissingAuthenticationToken",
        403,
    )
    wrong = client(service.url, secret="not-the-secret")
    assert code_and_status(wrong.send_message, QueueUrl=url, MessageBody="guessed") == (
        "SignatureDoesNotMatch",
        403,
    )
    producer = client(service.url, key="AKIAPRODUCER", secret="producer-secret")
    assert code_and_status(producer.purge_queue, QueueUrl=url) == ("AccessDenied", 403)
    admin.send_message(QueueUrl=url, MessageBody="signed")
    assert await stored(db, "keyed") == ["signed"]


# A Celery deployment's key: it sends (a retry is a SendMessage), receives, deletes and changes
# visibility in its own queues, and nothing else.
SCOPED = {
    **CREDENTIALS,
    "AKIACELERY": {"secret": "celery-secret", "roles": ["producer", "worker"], "queues": ["celery-*"]},
    "AKIAVIEWER": {"secret": "viewer-secret", "role": "viewer"},
    "AKIAOPS": {"secret": "ops-secret", "role": "admin", "queues": ["celery-*"]},
}


@pytest.fixture
def scoped(start_service):
    return start_service(tokens={"bearer-admin": "admin"}, aws_credentials=SCOPED, aws_regions=["eu-west-1"])


@pytest.mark.anyio
async def test_a_scoped_key_cannot_touch_other_queues(scoped, db):
    admin = client(scoped.url)
    native = admin.create_queue(QueueName="native")["QueueUrl"]
    admin.send_message(QueueUrl=native, MessageBody="keep me")
    celery = client(scoped.url, key="AKIACELERY", secret="celery-secret")
    ops = client(scoped.url, key="AKIAOPS", secret="ops-secret")
    for key in (celery, ops):
        assert code_and_status(key.delete_queue, QueueUrl=native) == ("AccessDenied", 403)
        assert code_and_status(key.purge_queue, QueueUrl=native) == ("AccessDenied", 403)
        assert code_and_status(key.send_message, QueueUrl=native, MessageBody="x") == ("AccessDenied", 403)
        assert code_and_status(key.receive_message, QueueUrl=native) == ("AccessDenied", 403)
        assert code_and_status(key.get_queue_attributes, QueueUrl=native) == ("AccessDenied", 403)
        assert code_and_status(key.get_queue_url, QueueName="native") == ("AccessDenied", 403)
        assert code_and_status(key.create_queue, QueueName="other") == ("AccessDenied", 403)
        arn = "arn:aws:sqs:eu-west-1:000000000000:native"
        assert code_and_status(key.list_message_move_tasks, SourceArn=arn)[0] == "AccessDenied"
    # The queue and its message are still there.
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'native'") == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'native'") == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'other'") == 0

    # Its own queues: create, send, receive, change visibility, delete. Not DeleteQueue or PurgeQueue,
    # which are an admin's (the scoped admin key may, in its queues).
    url = celery.create_queue(QueueName="celery-tasks")["QueueUrl"]
    assert [u.rsplit("/", 1)[-1] for u in celery.list_queues()["QueueUrls"]] == ["celery-tasks"]
    assert len(admin.list_queues()["QueueUrls"]) == 2
    celery.send_message(QueueUrl=url, MessageBody="task")
    (message,) = celery.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    handle = message["ReceiptHandle"]
    celery.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)
    celery.send_message(QueueUrl=url, MessageBody="retry of task")  # what Celery's self.retry does
    celery.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert celery.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert code_and_status(celery.purge_queue, QueueUrl=url) == ("AccessDenied", 403)
    assert code_and_status(celery.delete_queue, QueueUrl=url) == ("AccessDenied", 403)
    rows = await db.fetch(
        "SELECT status, payload #>> '{}' FROM jobq.all_jobs WHERE queue = 'celery-tasks' ORDER BY id"
    )
    assert [tuple(r) for r in rows] == [("completed", "task"), ("pending", "retry of task")]
    ops.purge_queue(QueueUrl=url)  # the scoped admin key may, in its queues
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'pending'") == 1  # native's


def test_a_viewer_key_only_reads(scoped):
    admin = client(scoped.url)
    url = admin.create_queue(QueueName="celery-tasks")["QueueUrl"]
    admin.send_message(QueueUrl=url, MessageBody="x")
    viewer = client(scoped.url, key="AKIAVIEWER", secret="viewer-secret")
    assert viewer.get_queue_url(QueueName="celery-tasks")["QueueUrl"] == url
    assert viewer.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert len(viewer.list_queues()["QueueUrls"]) == 1
    for call, kwargs in (
        (viewer.send_message, {"QueueUrl": url, "MessageBody": "x"}),
        (viewer.receive_message, {"QueueUrl": url}),
        (viewer.create_queue, {"QueueName": "celery-new"}),
        (viewer.purge_queue, {"QueueUrl": url}),
    ):
        assert code_and_status(call, **kwargs) == ("AccessDenied", 403)


@pytest.fixture(params=PROTOCOLS)
def keyed(request, start_service):
    """A service with the keys of SCOPED, and a client maker for a key, in each wire format."""
    service = start_service(
        tokens={"bearer-admin": "admin"}, aws_credentials=SCOPED, aws_regions=["us-east-1"]
    )

    def make(key: str, secret: str):
        if request.param == "json":
            return client(service.url, key=key, secret=secret, region="us-east-1")
        return query_client(service.url, request.getfixturevalue("query_model"), key=key, secret=secret)

    return make


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


def redrive_to(name: str, count: int = 1) -> dict[str, str]:
    return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(name), "maxReceiveCount": count})}


@pytest.mark.anyio
async def test_a_scoped_key_names_no_queue_outside_its_own_by_arn(keyed, db):
    admin = keyed("AKIAADMIN", "admin-secret")
    admin.create_queue(QueueName="qb")
    celery = keyed("AKIACELERY", "celery-secret")
    ops = keyed("AKIAOPS", "ops-secret")
    url = celery.create_queue(QueueName="celery-tasks")["QueueUrl"]
    for key in (celery, ops):
        # A dead-letter queue outside the key's queues, whether the queue is new or not (the Celery
        # key sets no attributes anyway: that is an admin's).
        assert code_and_status(key.create_queue, QueueName="celery-evil", Attributes=redrive_to("qb")) == (
            "AccessDenied",
            403,
        )
        assert code_and_status(key.set_queue_attributes, QueueUrl=url, Attributes=redrive_to("qb")) == (
            "AccessDenied",
            403,
        )
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'celery-evil'") == 0
    row = await db.fetchrow(
        "SELECT max_attempts, sqs_attributes FROM jobq.queues WHERE name = 'celery-tasks'"
    )
    assert row["max_attempts"] == 1000 and "RedrivePolicy" not in json.loads(row["sqs_attributes"])
    # So a message received past any maxReceiveCount stays in the key's queue, and qb gets nothing.
    celery.send_message(QueueUrl=url, MessageBody="task")
    for _ in range(2):
        assert celery.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["Body"] == "task"
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'qb'") == 0

    # A dead-letter queue among its queues is the key's to name, and its dead letters move there.
    celery.create_queue(QueueName="celery-dead")
    celery.create_queue(QueueName="celery-more", Attributes=redrive_to("celery-dead"))
    ops.set_queue_attributes(QueueUrl=url, Attributes=redrive_to("celery-dead", 3))
    celery.receive_message(QueueUrl=url, VisibilityTimeout=0)  # the third receive: out of receives
    await until(equals(states(db, "celery-dead"), {"pending": 1}))
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'qb'") == 0
    # What an unscoped admin set stands: qb's dead letters go into celery-dead, and the move task
    # that would take them back into qb is not the scoped keys' to start.
    admin.set_queue_attributes(
        QueueUrl=admin.get_queue_url(QueueName="qb")["QueueUrl"], Attributes=redrive_to("celery-dead")
    )
    dead_url = celery.get_queue_url(QueueName="celery-dead")["QueueUrl"]
    sources = celery.list_dead_letter_source_queues(QueueUrl=dead_url)["queueUrls"]
    assert [u.rsplit("/", 1)[-1] for u in sources] == ["celery-more", "celery-tasks"]
    for key in (celery, ops):
        for kwargs in (
            {"SourceArn": arn("celery-dead")},
            {"SourceArn": arn("celery-dead"), "DestinationArn": arn("qb")},
            {"SourceArn": arn("qb")},
        ):
            assert code_and_status(key.start_message_move_task, **kwargs)[0] == "AccessDenied"
    assert await states(db, "celery-dead")() == {"pending": 1}
