"""The SQS API through boto3 (botocore checks every MD5 itself) against a live service, with the
database checked behind it."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from botocore.exceptions import ClientError

from app.sqs.protocol import job_id_of
from tests.sqs.clients import sqs_client
from tests.waiting import states, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def sqs(service):
    return sqs_client(service.url)


def error_code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


async def test_queue_lifecycle(sqs, service, db):
    url = sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "45", "DelaySeconds": "2"})[
        "QueueUrl"
    ]
    assert url == f"{service.url}/000000000000/orders"
    # Creating it again with the same attributes is fine; with others it is not.
    assert sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "50"})
    assert error_code(exc) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName="orders")["QueueUrl"] == url
    sqs.create_queue(QueueName="other")
    assert sqs.list_queues()["QueueUrls"] == [url, f"{service.url}/000000000000/other"]
    assert sqs.list_queues(QueueNamePrefix="oth")["QueueUrls"] == [f"{service.url}/000000000000/other"]
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="none-")  # as SQS: no empty list
    page = sqs.list_queues(MaxResults=1)
    assert page["QueueUrls"] == [url]
    assert sqs.list_queues(MaxResults=1, NextToken=page["NextToken"])["QueueUrls"][0].endswith("/other")

    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["DelaySeconds"] == "2"
    assert attributes["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:orders"
    assert attributes["ApproximateNumberOfMessages"] == "0"
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "VisibilityTimeout": "60",
            "MessageRetentionPeriod": "3600",
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "maxReceiveCount": 3}
            ),
        },
    )
    row = await db.fetchrow(
        "SELECT visibility_timeout, max_attempts, sqs_attributes FROM jobq.queues WHERE name = 'orders'"
    )
    assert (row["visibility_timeout"], row["max_attempts"]) == (60.0, 3)
    assert json.loads(row["sqs_attributes"])["MessageRetentionPeriod"] == "3600"
    # A queue made through SQS without a RedrivePolicy keeps its messages however often received.
    assert await db.fetchval("SELECT max_attempts FROM jobq.queues WHERE name = 'other'") == 1000
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy", "VisibilityTimeout"])
    assert json.loads(got["Attributes"]["RedrivePolicy"])["maxReceiveCount"] == 3
    assert got["Attributes"]["VisibilityTimeout"] == "60"

    for bad in ({"VisibilityTimeout": "99999"}, {"DelaySeconds": "x"}):
        with pytest.raises(ClientError) as exc:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=bad)
        assert error_code(exc) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Colour": "blue"})
    assert error_code(exc) == "InvalidAttributeName"
    # A .fifo name is a FIFO queue's, which FifoQueue must ask for (tests/sqs/test_fifo.py).
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="jobs.fifo")
    assert error_code(exc) == "InvalidParameterValue"

    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.delete_queue(QueueUrl=url)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'orders'") == 0
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as exc:
        sqs.get_queue_url(QueueName="orders")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")


async def test_send_receive_delete_with_attributes(sqs, db):
    url = sqs.create_queue(QueueName="emails")["QueueUrl"]
    attributes = {
        "to": {"DataType": "String", "StringValue": "ada@example.com"},
        "tries": {"DataType": "Number", "StringValue": "3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "kind": {"DataType": "String.custom", "StringValue": "wélcome ✉"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello, wörld", MessageAttributes=attributes)
    job = await db.fetchrow("SELECT * FROM jobq.all_jobs WHERE id = $1", job_id_of(sent["MessageId"]))
    assert json.loads(job["payload"]) == "hello, wörld"  # the body is the payload, as a JSON string
    assert job["status"] == "pending"

    received = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], VisibilityTimeout=40
    )
    (message,) = received["Messages"]
    assert message["Body"] == "hello, wörld"
    assert message["MessageId"] == sent["MessageId"]
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(message["Attributes"]["SentTimestamp"]) / 1000 - time.time()) < 60
    assert int(message["Attributes"]["ApproximateFirstReceiveTimestamp"]) >= int(
        message["Attributes"]["SentTimestamp"]
    )
    row = await db.fetchrow("SELECT status, attempts, lease_expires_at - now() AS left FROM jobq.all_jobs")
    assert (row["status"], row["attempts"]) == ("running", 1)
    assert 35 < row["left"].total_seconds() <= 40
    # Only the attributes asked for, by name or prefix.
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert await db.fetchval("SELECT status FROM jobq.all_jobs") == "completed"
    # Deleting again succeeds, as in SQS.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    sqs.send_message(QueueUrl=url, MessageBody="2", MessageAttributes=attributes)
    # Only the attributes asked for, by name or prefix ("k.*" is every name starting with "k.").
    (message,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["to", "blob", "k.*"])["Messages"]
    assert set(message["MessageAttributes"]) == {"to", "blob"}
    assert "Attributes" not in message

    for bad in ("", "nul \x00 here"):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(QueueUrl=url, MessageBody=bad)
        assert error_code(exc) in ("MissingParameter", "InvalidMessageContents")
    with pytest.raises(ClientError) as exc:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert error_code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1))
    assert error_code(exc) == "InvalidParameterValue"


async def test_a_job_from_jobqs_api_is_received_through_sqs(sqs, service):
    url = sqs.create_queue(QueueName="mixed")["QueueUrl"]
    async with httpx.AsyncClient(base_url=service.url) as client:
        await client.post("/jobs", json={"queue": "mixed", "payload": {"to": "ada", "n": [1, 2]}})
        await client.post("/jobs", json={"queue": "mixed", "payload": "plain text"})
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        assert [json.loads(m["Body"]) for m in messages[:1]] == [{"to": "ada", "n": [1, 2]}]
        assert messages[1]["Body"] == "plain text"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
        job = (await client.get(f"/jobs/{job_id_of(messages[0]['MessageId'])}")).json()
        assert job["status"] == "completed"
        # And what SQS sent, jobq's API sees as a job.
        sent = sqs.send_message(QueueUrl=url, MessageBody='{"json": "text"}')
        job = (await client.get(f"/jobs/{job_id_of(sent['MessageId'])}")).json()
        assert job["payload"] == '{"json": "text"}'
        rows = (await client.get("/queues/mixed")).json()
        assert rows["pending"] == 1 and rows["running"] == 1


async def test_stale_receipt_handle_is_fenced(sqs, db):
    url = sqs.create_queue(QueueName="fenced")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="once")
    (first,) = sqs.receive_message(QueueUrl=url)["Messages"]
    # Visible again at once; the next receive gets a new handle and the first one is stale.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    (second,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["ApproximateReceiveCount"])[
        "Messages"
    ]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=10
        )
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs") == "running"
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=600)
    left = await db.fetchval("SELECT extract(epoch FROM lease_expires_at - now()) FROM jobq.all_jobs")
    assert 590 < left <= 600
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert await db.fetchval("SELECT status FROM jobq.all_jobs") == "completed"


async def test_batches_and_partial_failures(sqs, db):
    url = sqs.create_queue(QueueName="batches")["QueueUrl"]
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "bad \x01 char"},
            {
                "Id": "c",
                "MessageBody": "three",
                "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
            },
        ],
    )
    assert [s["Id"] for s in sent["Successful"]] == ["a", "c"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == [
        ("b", "InvalidMessageContents", True)
    ]
    assert await states(db, "batches")() == {"pending": 2}
    for entries, code in (
        ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            [{"Id": str(i), "MessageBody": "x"} for i in range(11)],
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            [{"Id": "x", "MessageBody": "1"}, {"Id": "x", "MessageBody": "2"}],
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
    ):
        with pytest.raises(ClientError) as exc:
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert error_code(exc) == code

    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])[
        "Messages"
    ]
    assert sorted(m["Body"] for m in messages) == ["one", "three"]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "m0", "ReceiptHandle": messages[0]["ReceiptHandle"], "VisibilityTimeout": 300},
            {"Id": "bad", "ReceiptHandle": "garbage", "VisibilityTimeout": 300},
        ],
    )
    assert [s["Id"] for s in changed["Successful"]] == ["m0"]
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"m{k}", "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(messages)]
        + [{"Id": "bad", "ReceiptHandle": "garbage"}],
    )
    assert sorted(s["Id"] for s in deleted["Successful"]) == ["m0", "m1"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    assert await states(db, "batches")() == {"completed": 2}


async def test_long_poll_wakes_on_send_and_counts(sqs, service):
    url = sqs.create_queue(QueueName="poll", Attributes={"DelaySeconds": "0"})["QueueUrl"]
    started = time.monotonic()
    empty = await asyncio.to_thread(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=1)
    assert empty.get("Messages", []) == [] and time.monotonic() - started >= 0.9

    waiting = asyncio.create_task(asyncio.to_thread(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=20))
    await until(lambda: service.app.state.runtime.wakeups._waiters.get("poll"))
    sent_at = time.monotonic()
    other = sqs_client(service.url)
    other.send_message(QueueUrl=url, MessageBody="wake up")
    (message,) = (await waiting)["Messages"]
    latency = time.monotonic() - sent_at
    assert message["Body"] == "wake up"
    assert latency < 1.0, latency

    other.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    counts = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    assert counts == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "1",
        "ApproximateNumberOfMessagesDelayed": "1",
    }
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.purge_queue(QueueUrl=url)
    assert (
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"][
            "ApproximateNumberOfMessagesNotVisible"
        ]
        == "0"
    )


async def test_queue_delay_applies_to_sends(sqs, db):
    url = sqs.create_queue(QueueName="delayed", Attributes={"DelaySeconds": "300"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.send_message(QueueUrl=url, MessageBody="y", DelaySeconds=0)
    delays = await db.fetch(
        "SELECT extract(epoch FROM run_at - created_at) AS d FROM jobq.all_jobs ORDER BY id"
    )
    assert 299 < delays[0]["d"] <= 301 and delays[1]["d"] < 1
    (message,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert message["Body"] == "y"


async def test_a_message_group_is_the_jobs_key(sqs, service, db):
    url = sqs.create_queue(QueueName="tenants")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="tenant-1/eu")
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "b", "MessageGroupId": "tenant-2"}]
    )
    keys = await db.fetch("SELECT key FROM jobq.all_jobs ORDER BY id")
    assert [k["key"] for k in keys] == ["tenant-1/eu", "tenant-2"]
    # Flow control on the queue applies to its message groups.
    async with httpx.AsyncClient(base_url=service.url) as http:
        assert (await http.patch("/queues/tenants", json={"key_concurrency": 1})).status_code == 200
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    groups = {m["MessageId"]: m["Attributes"]["MessageGroupId"] for m in received["Messages"]}
    assert groups[sent["MessageId"]] == "tenant-1/eu" and len(groups) == 2
    with pytest.raises(ClientError) as bad:
        sqs.send_message(QueueUrl=url, MessageBody="c", MessageGroupId="no spaces")
    assert error_code(bad) == "InvalidParameterValue"
