"""SQS's Query protocol (app/sqs/query.py) through a real SDK forced onto it: boto3 with SQS's service model
as botocore shipped it before SQS moved to JSON (botocore 1.29, `"protocol": "query"`), so requests go as
forms and answers are parsed as XML by botocore's own Query parser, as for every SDK of that age. The
model is taken from that botocore release on PyPI, once per machine, into ~/.cache/jobq-tests
(tests/sqs/clients.py); where PyPI cannot be reached the tests skip (and fail under CI=true). The database
is checked behind."""

from __future__ import annotations

import hashlib
import json
import re

import httpx
import pytest
from botocore.exceptions import ClientError

from app.sqs import query
from app.sqs.actions import ACTIONS
from app.sqs.protocol import job_id_of

# query_client and query_model (a fixture) are imported from here by tests/http/test_request_bodies.py.
from tests.sqs.clients import query_client, query_model  # noqa: F401
from tests.waiting import states

pytestmark = pytest.mark.anyio

ACCOUNT_PATH = "/000000000000"
CREDENTIALS = {"AKIAQUERY": {"secret": "query-secret", "role": "admin"}}


@pytest.fixture
def sqs(request, service):
    return query_client(service.url, request.getfixturevalue("query_model"))


def error_of(exc: pytest.ExceptionInfo) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


async def test_queues_through_the_query_protocol(sqs, service, db):
    url = sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "45", "DelaySeconds": "1"})[
        "QueueUrl"
    ]
    assert url == f"{service.url}{ACCOUNT_PATH}/orders"
    assert sqs.get_queue_url(QueueName="orders")["QueueUrl"] == url
    sqs.create_queue(QueueName="other")
    assert sqs.list_queues()["QueueUrls"] == [url, f"{service.url}{ACCOUNT_PATH}/other"]
    page = sqs.list_queues(MaxResults=1)
    assert page["QueueUrls"] == [url] and sqs.list_queues(MaxResults=1, NextToken=page["NextToken"])[
        "QueueUrls"
    ] == [f"{service.url}{ACCOUNT_PATH}/other"]
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="none-")  # as SQS: no empty list

    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"VisibilityTimeout": "60", "MaximumMessageSize": "2048"}
    )
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["VisibilityTimeout"], attributes["DelaySeconds"]) == ("60", "1")
    assert attributes["MaximumMessageSize"] == "2048"
    assert attributes["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:orders"
    only = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "DelaySeconds"])
    assert only["Attributes"] == {"VisibilityTimeout": "60", "DelaySeconds": "1"}
    row = await db.fetchrow("SELECT visibility_timeout FROM jobq.queues WHERE name = 'orders'")
    assert row["visibility_timeout"] == 60

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as exc:
        sqs.get_queue_url(QueueName="orders")
    assert error_of(exc) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    assert exc.value.response["Error"]["Type"] == "Sender"


async def test_messages_through_the_query_protocol(sqs, db):
    url = sqs.create_queue(QueueName="mail")["QueueUrl"]
    # What XML must carry exactly: markup characters, a carriage return, non-ASCII text.
    body = 'a <b>&amp; "c"\r\nd\tü 🙂'
    attributes = {
        "kind": {"DataType": "String", "StringValue": "welcome <1>"},
        "count": {"DataType": "Number", "StringValue": "3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert re.fullmatch("[0-9a-f]{32}", sent["MD5OfMessageAttributes"])
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "one", "MessageBody": "1"}, {"Id": "two", "MessageBody": "2", "DelaySeconds": 0}],
    )
    assert sorted(entry["Id"] for entry in batch["Successful"]) == ["one", "two"]
    assert "Failed" not in batch

    received = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
        WaitTimeSeconds=1,
    )["Messages"]
    by_body = {m["Body"]: m for m in received}
    assert set(by_body) == {body, "1", "2"}
    first = by_body[body]
    assert first["MessageId"] == sent["MessageId"] and first["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert first["MessageAttributes"] == attributes
    assert first["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    stored = await db.fetchval(
        "SELECT payload #>> '{}' FROM jobq.all_jobs WHERE id = $1", job_id_of(first["MessageId"])
    )
    assert stored == body  # a message is stored as its body, a JSON string

    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=100)
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "ReceiptHandle": by_body["1"]["ReceiptHandle"], "VisibilityTimeout": 100},
            {"Id": "bad", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 100},
        ],
    )
    assert [e["Id"] for e in changed["Successful"]] == ["ok"]
    (failed,) = changed["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == ("bad", "ReceiptHandleIsInvalid", True)

    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "d1", "ReceiptHandle": by_body["1"]["ReceiptHandle"]},
            {"Id": "d2", "ReceiptHandle": "x"},
        ],
    )
    assert [e["Id"] for e in deleted["Successful"]] == ["d1"] and deleted["Failed"][0]["Id"] == "d2"
    assert await states(db, "mail")() == {"completed": 2, "running": 1}

    sqs.purge_queue(QueueUrl=url)
    assert await states(db, "mail")() == {"completed": 2}


async def test_errors_come_as_the_query_protocol_reports_them(sqs, service):
    url = sqs.create_queue(QueueName="strict")["QueueUrl"]
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "same", "MessageBody": "a"}] * 2)
    assert error_of(exc) == ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400)
    with pytest.raises(ClientError) as exc:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert error_of(exc)[0] == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="forged")
    assert error_of(exc)[0] == "ReceiptHandleIsInvalid"
    # An error that quotes what was sent stays well-formed XML, whatever was sent.
    with pytest.raises(ClientError) as exc:
        sqs.get_queue_url(QueueName="no\x01such")
    assert error_of(exc) == ("AWS.SimpleQueueService.NonExistentQueue", 400)

    async with httpx.AsyncClient(base_url=service.url) as http:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        unknown = await http.post("/", content="Action=Explode&Version=2012-11-05", headers=form)
        assert unknown.status_code == 400 and unknown.headers["content-type"].startswith("text/xml")
        assert "<Code>InvalidAction</Code>" in unknown.text and "Explode" in unknown.text
        missing = await http.post("/", content="Version=2012-11-05", headers=form)
        assert "<Code>MissingAction</Code>" in missing.text
        not_integer = await http.post(
            "/", content=f"Action=ReceiveMessage&QueueUrl={url}&MaxNumberOfMessages=ten", headers=form
        )
        assert not_integer.status_code == 400 and "MaxNumberOfMessages" in not_integer.text


# Indexes no list may have, by what is wrong with each.
BAD_INDEXES = {
    "superscript": "\u00b2",
    "arabic-indic": "\u0663",
    "zero": "0",
    "leading-zero": "01",
    "letter": "x",
    "5000-digits": "1" * 5000,
    "too-high": "10000",
}


async def test_a_list_index_that_is_not_one_is_a_validation_error(service):
    """Items of a list or map are numbered 1, 2, 3, ... in ASCII digits; any other index is the client's
    mistake (it was a 500 for digits Python's int() refuses, or a number of 5,000 digits). One service
    takes every case: each request is refused, and changes nothing the next one meets."""
    url = f"{service.url}/000000000000/indexes"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with httpx.AsyncClient(base_url=service.url) as http:
        await http.post("/", content="Action=CreateQueue&QueueName=indexes", headers=form)
        for label, index in BAD_INDEXES.items():
            for content in (
                f"Action=SendMessage&QueueUrl={url}&MessageBody=m&MessageAttribute.{index}.Name=a"
                "&MessageAttribute.1.Value.DataType=String&MessageAttribute.1.Value.StringValue=v",
                f"Action=GetQueueAttributes&QueueUrl={url}&AttributeName.{index}=All",
                f"Action=ReceiveMessage&QueueUrl={url}&MessageAttributeName.1=a&MessageAttributeName.{index}=b",
            ):
                answer = await http.post("/", content=content.encode(), headers=form)
                assert answer.status_code == 400, (label, answer.text)
                assert "<Code>InvalidParameterValue</Code>" in answer.text, label
                assert "numbered 1, 2, 3" in answer.text and len(answer.text) < 1000, label
        for value in ("\u0663", "1_0", " 3"):  # int() would take these
            answer = await http.post(
                "/", content=f"Action=ReceiveMessage&QueueUrl={url}&MaxNumberOfMessages={value}", headers=form
            )
            assert answer.status_code == 400 and "not an integer" in answer.text, answer.text


async def test_a_query_request_may_go_to_the_queue_url(service, db):
    """As the AWS SDK for Java 1.x sends them: to the queue's URL, which names the queue."""
    form = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    async with httpx.AsyncClient(base_url=service.url) as http:
        created = await http.post("/", content="Action=CreateQueue&QueueName=java", headers=form)
        assert "<QueueUrl>" in created.text
        sent = await http.post(
            f"{ACCOUNT_PATH}/java",
            content="Action=SendMessage&MessageBody=from+java&Version=2012-11-05",
            headers=form,
        )
        assert sent.status_code == 200, sent.text
        assert re.search(
            r"<SendMessageResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\">", sent.text
        )
        message_id = re.search("<MessageId>(.*?)</MessageId>", sent.text)[1]
        gone = await http.post(
            f"{ACCOUNT_PATH}/nosuch", content="Action=SendMessage&MessageBody=x", headers=form
        )
        assert gone.status_code == 400 and "AWS.SimpleQueueService.NonExistentQueue" in gone.text
    payload = await db.fetchval("SELECT payload FROM jobq.all_jobs WHERE id = $1", job_id_of(message_id))
    assert json.loads(payload) == "from java"


async def test_signed_query_requests(request, start_service, db):
    model = request.getfixturevalue("query_model")
    service = start_service(aws_credentials=CREDENTIALS, aws_regions=["us-east-1"])
    signed = query_client(service.url, model, key="AKIAQUERY", secret="query-secret")
    url = signed.create_queue(QueueName="signed")["QueueUrl"]
    signed.send_message(QueueUrl=url, MessageBody="kept")
    forged = query_client(service.url, model, key="AKIAQUERY", secret="wrong")
    with pytest.raises(ClientError) as exc:
        forged.send_message(QueueUrl=url, MessageBody="forged")
    assert error_of(exc) == ("SignatureDoesNotMatch", 403)
    async with httpx.AsyncClient(base_url=service.url) as http:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        unsigned = await http.post("/", content="Action=Explode", headers=form)
    assert unsigned.status_code == 403 and "<Code>MissingAuthenticationToken</Code>" in unsigned.text
    payloads = await db.fetch("SELECT payload #>> '{}' AS body FROM jobq.all_jobs")
    assert [r["body"] for r in payloads] == ["kept"]


async def test_a_form_another_site_makes_a_browser_post_is_refused(service, db):
    """A form is what any web page can make a browser send (no preflight): the Query protocol must not
    open the SQS API to cross-site request forgery (app/http/middleware/origin.py)."""
    async with httpx.AsyncClient(base_url=service.url) as http:
        forged = await http.post(
            "/",
            content="Action=CreateQueue&QueueName=forged",
            headers={"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "cross-site"},
        )
    assert forged.status_code == 403
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'forged'") == 0


def test_the_query_protocol_serves_every_action():
    assert set(query.ACTIONS) == set(ACTIONS)
