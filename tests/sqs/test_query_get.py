"""SQS's Query protocol over GET (issue 50, point 2): ``GET /?Action=...`` and ``GET /<account>/<queue>``,
signed in the Authorization header or presigned in the URL by botocore's own signers (SigV4Auth,
SigV4QueryAuth), JSON answers to Query requests that ask for them (``Accept: application/json``), and the
errors SQS gives for an unknown action, a missing parameter and an empty batch, in both wire formats.

Every request goes to a real service over HTTP; every refusal is checked to have changed nothing in the
database."""

from __future__ import annotations

import contextlib
import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import botocore.auth
import httpx
import pytest
from botocore.auth import S3SigV4QueryAuth, SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from app.sqs import query
from tests.sqs.clients import make_client, query_client, query_model  # noqa: F401 - a fixture
from tests.waiting import states

pytestmark = pytest.mark.anyio

ACCOUNT = "000000000000"
REGION = "eu-west-1"
KEY, SECRET = "AKIAGETADMIN", "get-admin-secret"
CREDENTIALS = {
    KEY: {"secret": SECRET, "role": "admin"},
    "AKIAGETPRODUCER": {"secret": "get-producer-secret", "role": "producer"},
}
JSON_TYPE = "application/x-amz-json-1.0"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
NS = {"sqs": query.NAMESPACE}


@pytest.fixture
def secured(start_service):
    """A service that takes only requests signed with a key of CREDENTIALS, in REGION."""
    return start_service(aws_credentials=CREDENTIALS, aws_regions=[REGION])


# --- speaking the Query protocol over GET --------------------------------------------------------------


def get(url: str, params: dict[str, str] | None = None, **headers: str) -> httpx.Response:
    """GET `url` (with `params` in its query string, when given) exactly as given."""
    target = f"{url}?{urlencode(params)}" if params else url
    return httpx.get(target, headers=headers, timeout=30)


def presign(
    base: str,
    path: str,
    params: dict[str, str],
    *,
    key: str = KEY,
    secret: str = SECRET,
    region: str = REGION,
    expires: int = 300,
    service: str = "sqs",
) -> str:
    """The presigned URL of ``GET <path>?<params>``, signed by botocore's query-string signer."""
    request = AWSRequest(method="GET", url=f"{base}{path}", params=params)
    SigV4QueryAuth(Credentials(key, secret), service, region, expires=expires).add_auth(request)
    return request.url


def signed_in_headers(base: str, path: str, params: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The URL and headers of ``GET <path>?<params>`` signed in its Authorization header by botocore."""
    request = AWSRequest(method="GET", url=f"{base}{path}", params=params)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", REGION).add_auth(request)
    prepared = request.prepare()
    return prepared.url, dict(prepared.headers)


@contextlib.contextmanager
def signing_at(when: datetime) -> Iterator[None]:
    """botocore's signers sign as at `when` (a URL presigned then, as a captured one would have been)."""
    original = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: when.replace(tzinfo=None)
    try:
        yield
    finally:
        botocore.auth.get_current_datetime = original


def result(response: httpx.Response, action: str) -> ET.Element:
    """The ``<{action}Result>`` of a successful XML answer, or its root for an action that answers
    nothing but its request id."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/xml")
    root = ET.fromstring(response.content)
    assert root.tag == f"{{{query.NAMESPACE}}}{action}Response"
    found = root.find(f"sqs:{action}Result", NS)
    return found if found is not None else root


def error(response: httpx.Response) -> tuple[int, str, str]:
    """Status, code and message of an SQS error, in XML (the Query protocol's) or JSON (JSON 1.0's)."""
    if response.headers["content-type"].startswith("text/xml"):
        root = ET.fromstring(response.content)
        code = root.findtext("sqs:Error/sqs:Code", namespaces=NS)
        message = root.findtext("sqs:Error/sqs:Message", namespaces=NS)
        return response.status_code, code or "", message or ""
    assert response.headers["content-type"] == JSON_TYPE, response.headers
    body = response.json()
    return response.status_code, body["__type"].rpartition("#")[2], body["message"]


async def queue_names(db) -> list[str]:
    return [r["name"] for r in await db.fetch("SELECT name FROM jobq.queues ORDER BY name")]


async def bodies(db, queue: str) -> list[str]:
    rows = await db.fetch(
        "SELECT payload #>> '{}' AS body FROM jobq.all_jobs WHERE queue = $1 ORDER BY id", queue
    )
    return [r["body"] for r in rows]


# --- GET on a service without credentials --------------------------------------------------------------


async def test_queues_and_messages_over_get(service, db):
    created = get(f"{service.url}/", {"Action": "CreateQueue", "QueueName": "got", "Version": "2012-11-05"})
    url = result(created, "CreateQueue").findtext("sqs:QueueUrl", namespaces=NS)
    assert url == f"{service.url}/{ACCOUNT}/got"
    listed = result(get(f"{service.url}/", {"Action": "ListQueues"}), "ListQueues")
    assert [e.text for e in listed.findall("sqs:QueueUrl", NS)] == [url]

    # At the queue's URL, which names the queue, as the AWS SDK for Java 1.x sends them.
    text = "over GET & <back> \u00fc"
    sent = result(get(url, {"Action": "SendMessage", "MessageBody": text}), "SendMessage")
    assert sent.findtext("sqs:MD5OfMessageBody", namespaces=NS) == hashlib.md5(text.encode()).hexdigest()
    assert await bodies(db, "got") == [text]
    received = result(
        get(url, {"Action": "ReceiveMessage", "WaitTimeSeconds": "1", "VisibilityTimeout": "60"}),
        "ReceiveMessage",
    )
    (message,) = received.findall("sqs:Message", NS)
    assert message.findtext("sqs:Body", namespaces=NS) == text
    assert message.findtext("sqs:MessageId", namespaces=NS) == sent.findtext("sqs:MessageId", namespaces=NS)
    handle = message.findtext("sqs:ReceiptHandle", namespaces=NS)
    result(get(url, {"Action": "DeleteMessage", "ReceiptHandle": handle}), "DeleteMessage")
    assert await states(db, "got")() == {"completed": 1}
    result(get(url, {"Action": "DeleteQueue"}), "DeleteQueue")
    assert await queue_names(db) == []


async def test_a_get_without_an_action_or_with_another_method_does_nothing(service, db):
    assert error(get(f"{service.url}/")) == (
        400,
        "MissingAction",
        "The request must contain the parameter Action.",
    )
    # HEAD is no way around anything: it is not served at all.
    head = httpx.head(f"{service.url}/?{urlencode({'Action': 'CreateQueue', 'QueueName': 'headed'})}")
    assert head.status_code == 405
    assert await queue_names(db) == []


async def test_a_get_another_site_makes_a_browser_send_is_refused(start_service, db):
    """An image or a link on another site is a GET the browser sends with the user's reach: on a service
    that takes unsigned requests it must not act, as a cross-site POST does not (the same rule,
    app/http/middleware/origin.py)."""
    service = start_service(trusted_origins=["https://ops.example"])
    create = {"Action": "CreateQueue", "QueueName": "forged"}
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://attacker.example"},
    ):
        refused = get(f"{service.url}/", create, **headers)
        status, code, message = error(refused)
        assert (status, code) == (403, "AccessDenied"), headers
        assert message.startswith("Cross-origin request refused"), message
        # In JSON too, for a request that asks for it.
        assert error(get(f"{service.url}/", create, Accept="application/json", **headers))[:2] == (
            403,
            "AccessDenied",
        )
    assert await queue_names(db) == []
    # The user's own doing (the address bar), a page of the service's own origin, a trusted origin.
    for n, headers in enumerate(
        ({"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}, {"Origin": "https://ops.example"})
    ):
        result(get(f"{service.url}/", {**create, "QueueName": f"fine-{n}"}, **headers), "CreateQueue")
    assert await queue_names(db) == ["fine-0", "fine-1", "fine-2"]


# --- signatures ----------------------------------------------------------------------------------------


async def test_a_presigned_url_and_a_get_signed_in_headers_are_accepted(secured, db):
    result(get(presign(secured.url, "/", {"Action": "CreateQueue", "QueueName": "signed"})), "CreateQueue")
    queue_path = f"/{ACCOUNT}/signed"
    url = presign(secured.url, queue_path, {"Action": "SendMessage", "MessageBody": "presigned"})
    result(get(url), "SendMessage")
    # A presigned URL is good until it expires, as often as it is used: that is what it is for.
    result(get(url), "SendMessage")
    signed_url, headers = signed_in_headers(
        secured.url, queue_path, {"Action": "SendMessage", "MessageBody": "in headers"}
    )
    assert "authorization" in {h.lower() for h in headers}
    result(httpx.get(signed_url, headers=headers), "SendMessage")
    # Signed an hour ago for two hours: still good (a header's signature is good for 15 minutes only).
    with signing_at(datetime.now(UTC) - timedelta(hours=1)):
        old = presign(secured.url, queue_path, {"Action": "SendMessage", "MessageBody": "old"}, expires=7200)
    result(get(old), "SendMessage")
    # Signed as S3's presigned URLs are, the payload UNSIGNED-PAYLOAD: a GET has no body to leave unsigned.
    request = AWSRequest(
        method="GET",
        url=f"{secured.url}{queue_path}",
        params={"Action": "SendMessage", "MessageBody": "s3-style"},
    )
    S3SigV4QueryAuth(Credentials(KEY, SECRET), "sqs", REGION, expires=300).add_auth(request)
    result(get(request.url), "SendMessage")
    assert await bodies(db, "signed") == ["presigned", "presigned", "in headers", "old", "s3-style"]


async def test_an_unsigned_get_is_refused_when_credentials_are_configured(secured, db):
    for path in ("/", f"/{ACCOUNT}/anything"):
        refused = get(f"{secured.url}{path}", {"Action": "CreateQueue", "QueueName": "anonymous"})
        assert error(refused) == (
            403,
            "MissingAuthenticationToken",
            "Requests must be signed with AWS Signature Version 4 (an access key id and secret).",
        )
    # Before the action is even looked at: a stranger learns nothing of what is served.
    assert error(get(f"{secured.url}/", {"Action": "Explode"}))[1] == "MissingAuthenticationToken"
    assert await queue_names(db) == []


async def test_a_tampered_presigned_url_is_refused(secured, db):
    for name in ("kept", "other"):
        result(get(presign(secured.url, "/", {"Action": "CreateQueue", "QueueName": name})), "CreateQueue")
    url = presign(secured.url, f"/{ACCOUNT}/kept", {"Action": "SendMessage", "MessageBody": "honest"})
    mismatch = (
        403,
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided.",
    )
    tampered = [
        url.replace("MessageBody=honest", "MessageBody=forged"),  # a parameter changed
        url.replace("MessageBody=honest", "MessageBody=honest&DelaySeconds=900"),  # one added
        url.replace(f"/{ACCOUNT}/kept", f"/{ACCOUNT}/other"),  # another queue
        url.replace("Action=SendMessage", "Action=PurgeQueue"),  # another action
        url.replace("X-Amz-Expires=300", "X-Amz-Expires=3600"),  # a longer life
    ]
    for forged in tampered:
        assert forged != url
        assert error(get(forged)) == mismatch, forged
    # A body given to the URL: a presigned URL signs an empty one, whatever payload it was signed for.
    for signer in (SigV4QueryAuth, S3SigV4QueryAuth):
        request = AWSRequest(method="GET", url=f"{secured.url}/", params={"Action": "ListQueues"})
        signer(Credentials(KEY, SECRET), "sqs", REGION, expires=300).add_auth(request)
        added = httpx.request("GET", request.url, content=b"Action=DeleteQueue&QueueName=kept")
        assert error(added)[:2] == (403, "SignatureDoesNotMatch"), signer
        result(get(request.url), "ListQueues")
    # The same URL as a POST: a presigned URL signs one method, and POSTs are signed in headers.
    assert error(httpx.post(url, headers=FORM))[:2] == (403, "MissingAuthenticationToken")
    # Signed for another service or region, or not in full.
    other_service = presign(secured.url, "/", {"Action": "ListQueues"}, service="s3")
    assert error(get(other_service))[:2] == (403, "SignatureDoesNotMatch")
    other_region = presign(secured.url, "/", {"Action": "ListQueues"}, region="us-west-2")
    assert error(get(other_region))[:2] == (403, "SignatureDoesNotMatch")
    without_expiry = url.replace("&X-Amz-Expires=300", "")
    status, code, message = error(get(without_expiry))
    assert (status, code) == (403, "IncompleteSignature") and "X-Amz-Expires" in message
    wrong_secret = presign(secured.url, "/", {"Action": "ListQueues"}, secret="guessed")
    assert error(get(wrong_secret)) == mismatch
    unknown_key = presign(secured.url, "/", {"Action": "ListQueues"}, key="AKIANOBODY")
    assert error(get(unknown_key))[:2] == (403, "InvalidClientTokenId")
    # A signature in the URL and another in the headers: which one to check is not the sender's choice.
    _, headers = signed_in_headers(secured.url, "/", {"Action": "ListQueues"})
    assert error(httpx.get(url, headers={"Authorization": headers["Authorization"]}))[:2] == (
        403,
        "IncompleteSignature",
    )
    assert await bodies(db, "kept") == [] and await bodies(db, "other") == []
    result(get(url), "SendMessage")  # the untouched URL
    assert await bodies(db, "kept") == ["honest"]


async def test_a_presigned_url_is_refused_once_it_has_expired(secured, db):
    result(get(presign(secured.url, "/", {"Action": "CreateQueue", "QueueName": "late"})), "CreateQueue")
    send = {"Action": "SendMessage", "MessageBody": "replayed"}
    with signing_at(datetime.now(UTC) - timedelta(minutes=10)):
        expired = presign(secured.url, f"/{ACCOUNT}/late", send, expires=60)
    status, code, message = error(get(expired))
    assert (status, code) == (403, "RequestExpired")
    assert message.startswith("Request has expired: it was valid for 60 seconds from ")
    # Dated more than 15 minutes ahead: not valid yet, whatever its expiry.
    with signing_at(datetime.now(UTC) + timedelta(hours=1)):
        early = presign(secured.url, f"/{ACCOUNT}/late", send, expires=7200)
    assert error(get(early))[:2] == (403, "RequestExpired")
    # A week at most, as AWS allows.
    too_long = presign(secured.url, f"/{ACCOUNT}/late", send, expires=604801)
    status, code, message = error(get(too_long))
    assert (status, code) == (403, "IncompleteSignature") and "604800" in message
    assert await bodies(db, "late") == []


async def test_a_presigned_url_carries_its_key_roles_and_nothing_more(secured, db):
    result(get(presign(secured.url, "/", {"Action": "CreateQueue", "QueueName": "roles"})), "CreateQueue")
    producer = {"key": "AKIAGETPRODUCER", "secret": "get-producer-secret"}
    result(
        get(
            presign(
                secured.url, f"/{ACCOUNT}/roles", {"Action": "SendMessage", "MessageBody": "p"}, **producer
            )
        ),
        "SendMessage",
    )
    purge = presign(secured.url, f"/{ACCOUNT}/roles", {"Action": "PurgeQueue"}, **producer)
    assert error(get(purge)) == (403, "AccessDenied", "A key of role producer may not call PurgeQueue.")
    assert await bodies(db, "roles") == ["p"]


# --- JSON answers to Query requests --------------------------------------------------------------------


async def test_a_query_request_that_accepts_json_is_answered_in_json(service, db):
    accept = {"Accept": "application/json"}
    created = httpx.post(
        f"{service.url}/", content="Action=CreateQueue&QueueName=jsonic", headers={**FORM, **accept}
    )
    assert created.status_code == 200 and created.headers["content-type"] == JSON_TYPE
    url = f"{service.url}/{ACCOUNT}/jsonic"
    assert created.json() == {"QueueUrl": url}  # the body a JSON 1.0 request gets

    sent = get(url, {"Action": "SendMessage", "MessageBody": "as JSON"}, **accept)
    assert sent.headers["content-type"] == JSON_TYPE
    assert sent.json()["MD5OfMessageBody"] == hashlib.md5(b"as JSON").hexdigest()
    listed = get(f"{service.url}/", {"Action": "ListQueues"}, Accept="text/html, application/json;q=0.9")
    assert listed.json() == {"QueueUrls": [url]}
    # Errors too, as JSON 1.0 sends them, the Query protocol's code in x-amzn-query-error.
    missing = get(f"{service.url}/{ACCOUNT}/nowhere", {"Action": "SendMessage", "MessageBody": "x"}, **accept)
    assert error(missing) == (400, "QueueDoesNotExist", "The specified queue nowhere does not exist.")
    assert missing.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    form_error = httpx.post(
        f"{service.url}/", content="Action=GetQueueUrl&QueueName=nowhere", headers={**FORM, **accept}
    )
    assert error(form_error) == (400, "QueueDoesNotExist", "The specified queue nowhere does not exist.")
    # XML otherwise: no Accept, any type, or JSON refused (q=0).
    for other in ({}, {"Accept": "*/*"}, {"Accept": "application/json;q=0, text/xml"}):
        result(get(f"{service.url}/", {"Action": "ListQueues"}, **other), "ListQueues")
    assert await bodies(db, "jsonic") == ["as JSON"] and await queue_names(db) == ["jsonic"]


# --- SQS's errors: an unknown action, a missing parameter, an empty batch --------------------------------


async def test_an_unknown_action_is_refused_in_each_wire_format(service, db):
    invalid = (400, "InvalidAction", "The action Explode is not valid for this endpoint.")
    assert error(get(f"{service.url}/", {"Action": "Explode"})) == invalid
    assert error(httpx.post(f"{service.url}/", content="Action=Explode", headers=FORM)) == invalid
    as_json = get(f"{service.url}/", {"Action": "Explode"}, Accept="application/json")
    assert error(as_json) == invalid and as_json.headers["x-amzn-query-error"] == "InvalidAction;Sender"
    unknown = httpx.post(
        f"{service.url}/",
        content=b"{}",
        headers={"Content-Type": JSON_TYPE, "X-Amz-Target": "AmazonSQS.Explode"},
    )
    assert error(unknown) == (400, "UnknownOperationException", "jobq does not implement AmazonSQS.Explode.")
    untargeted = httpx.post(f"{service.url}/", content=b"{}", headers={"Content-Type": JSON_TYPE})
    assert error(untargeted) == (400, "UnknownOperationException", "Send X-Amz-Target: AmazonSQS.<Action>.")
    assert await queue_names(db) == []


def json_post(service, action: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{service.url}/",
        content=json.dumps(body).encode(),
        headers={"Content-Type": JSON_TYPE, "X-Amz-Target": f"AmazonSQS.{action}"},
    )


async def test_a_missing_parameter_is_refused_in_each_wire_format(service, db):
    url = result(
        get(f"{service.url}/", {"Action": "CreateQueue", "QueueName": "params"}), "CreateQueue"
    ).findtext("sqs:QueueUrl", namespaces=NS)
    no_body = (400, "MissingParameter", "The request must contain the parameter MessageBody.")
    no_name = (400, "MissingParameter", "The request must contain the parameter QueueName.")
    assert error(get(url, {"Action": "SendMessage"})) == no_body
    assert (
        error(httpx.post(f"{service.url}/", content=f"Action=SendMessage&QueueUrl={url}", headers=FORM))
        == no_body
    )
    assert error(get(url, {"Action": "SendMessage"}, Accept="application/json")) == no_body
    assert error(json_post(service, "SendMessage", {"QueueUrl": url})) == no_body
    assert error(get(f"{service.url}/", {"Action": "CreateQueue"})) == no_name
    assert error(json_post(service, "CreateQueue", {})) == no_name
    no_url = (400, "MissingParameter", "The request must contain the parameter QueueUrl.")
    assert error(get(f"{service.url}/", {"Action": "SendMessage", "MessageBody": "x"})) == no_url
    assert await bodies(db, "params") == [] and await queue_names(db) == ["params"]


BATCHES = ["SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"]
EMPTY = "There should be at least one entry in the request."


async def test_an_empty_batch_is_refused_in_each_wire_format(service, db, request):
    url = result(
        get(f"{service.url}/", {"Action": "CreateQueue", "QueueName": "batches"}), "CreateQueue"
    ).findtext("sqs:QueueUrl", namespaces=NS)
    get(url, {"Action": "SendMessage", "MessageBody": "stays"})
    query_empty = (400, "AWS.SimpleQueueService.EmptyBatchRequest", EMPTY)
    json_empty = (400, "EmptyBatchRequest", EMPTY)
    for action in BATCHES:
        # The Query protocol: no entries at all, or the empty list botocore sends (`<Entry>=`).
        entry = query.ACTIONS[action][0].members["Entries"].item
        assert error(get(url, {"Action": action})) == query_empty, action
        assert error(get(url, {"Action": action, entry: ""})) == query_empty, action
        assert error(httpx.post(url, content=f"Action={action}", headers=FORM)) == query_empty, action
        as_json = get(url, {"Action": action}, Accept="application/json")
        assert error(as_json) == json_empty
        assert as_json.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.EmptyBatchRequest;Sender"
        assert error(json_post(service, action, {"QueueUrl": url, "Entries": []})) == json_empty, action

    # Through boto3, in each wire format.
    clients = {
        "json": make_client(service.url),
        "query": query_client(service.url, request.getfixturevalue("query_model")),
    }
    for protocol, sqs in clients.items():
        for call in (sqs.send_message_batch, sqs.delete_message_batch, sqs.change_message_visibility_batch):
            with pytest.raises(ClientError) as exc:
                call(QueueUrl=url, Entries=[])
            response = exc.value.response
            assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
            assert response["Error"]["Code"] == "AWS.SimpleQueueService.EmptyBatchRequest", protocol
            assert response["Error"]["Message"] == EMPTY
    assert await states(db, "batches")() == {"pending": 1}
