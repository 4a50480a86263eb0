"""Trace context through the SQS API (app/sqs/trace_context.py), with boto3 against a live service: the
AWSTraceHeader system attribute and a W3C `traceparent` message attribute become the job's traceparent,
and a receive hands AWSTraceHeader back, for messages and for jobs enqueued through jobq's API."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from app.sqs.protocol import job_id_of
from tests.sqs.clients import sqs_client
from tests.sqs.test_boto3 import error_code

pytestmark = pytest.mark.anyio

TRACE_ID = "5759e988bd862e3fe1be46a994272793"
HEADER = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled={}"
TRACEPARENT = f"00-{TRACE_ID}-53995c3f42cd8ad8-{{}}"
W3C = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
W3C_AS_HEADER = "Root=1-0af76519-16cd43dd8448eb211c80319c;Parent=b7ad6b7169203331;Sampled=1"


@pytest.fixture
def sqs(service):
    return sqs_client(service.url)


def traced(header: str) -> dict:
    return {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}


def strings(**values: str) -> dict:
    return {name: {"DataType": "String", "StringValue": value} for name, value in values.items()}


async def trace_of(client, message_id: str) -> tuple[str | None, str | None]:
    job = (await client.get(f"/jobs/{job_id_of(message_id)}")).json()
    return job["traceparent"], job["tracestate"]


async def test_aws_trace_header_round_trip(sqs, client):
    url = sqs.create_queue(QueueName="xray")["QueueUrl"]
    for sampled, flags in (("1", "01"), ("0", "00")):
        header = HEADER.format(sampled)
        sent = sqs.send_message(QueueUrl=url, MessageBody=sampled, MessageSystemAttributes=traced(header))
        assert len(sent["MD5OfMessageSystemAttributes"]) == 32
        assert await trace_of(client, sent["MessageId"]) == (TRACEPARENT.format(flags), None)
        (message,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["AWSTraceHeader"])[
            "Messages"
        ]
        assert message["MessageId"] == sent["MessageId"]
        assert message["Attributes"] == {"AWSTraceHeader": header}
        # Asked for with the older AttributeNames, and with All.
        for asked in ({"AttributeNames": ["AWSTraceHeader"]}, {"MessageSystemAttributeNames": ["All"]}):
            sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
            (message,) = sqs.receive_message(QueueUrl=url, **asked)["Messages"]
            assert message["Attributes"]["AWSTraceHeader"] == header
        # Not asked for: not there.
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
        (message,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["SentTimestamp"])[
            "Messages"
        ]
        assert set(message["Attributes"]) == {"SentTimestamp"}
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    # Fields in any order, others skipped, Sampled deferred ("?") or missing, upper-case hex: X-Ray's
    # header as OpenTelemetry's X-Ray propagator reads it; the receive answers the canonical form.
    for header in (
        "Parent=53995C3F42CD8AD8;Lineage=a87bd80c:1|68fd508a:5;Sampled=?;Root=1-5759E988-BD862E3FE1BE46A994272793",
        f"Root=1-5759e988-bd862e3fe1be46a994272793; Parent=53995c3f42cd8ad8;Self=1-{'a' * 8}-{'b' * 24}",
    ):
        sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes=traced(header))
        assert await trace_of(client, sent["MessageId"]) == (TRACEPARENT.format("00"), None)
        (message,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["All"])["Messages"]
        assert message["Attributes"]["AWSTraceHeader"] == HEADER.format("0")
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    # A FIFO queue's messages too.
    fifo = sqs.create_queue(QueueName="xray.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    sent = sqs.send_message(
        QueueUrl=fifo,
        MessageBody="f",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        MessageSystemAttributes=traced(HEADER.format("1")),
    )
    assert await trace_of(client, sent["MessageId"]) == (TRACEPARENT.format("01"), None)
    (message,) = sqs.receive_message(QueueUrl=fifo, AttributeNames=["All"])["Messages"]
    assert message["Attributes"]["AWSTraceHeader"] == HEADER.format("1")


async def test_send_message_batch_traces_each_entry(sqs, client, db):
    url = sqs.create_queue(QueueName="xray-batch")["QueueUrl"]
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "header", "MessageBody": "1", "MessageSystemAttributes": traced(HEADER.format("1"))},
            {
                "Id": "attribute",
                "MessageBody": "2",
                "MessageAttributes": strings(traceparent=W3C, tracestate="a=1"),
            },
            {"Id": "plain", "MessageBody": "3"},
            {"Id": "bad", "MessageBody": "4", "MessageSystemAttributes": traced("Root=1-5759e988;Sampled=1")},
        ],
    )
    ids = {s["Id"]: s["MessageId"] for s in sent["Successful"]}
    assert set(ids) == {"header", "attribute", "plain"}
    assert "MD5OfMessageSystemAttributes" in next(s for s in sent["Successful"] if s["Id"] == "header")
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == [
        ("bad", "InvalidParameterValue", True)
    ]
    assert await trace_of(client, ids["header"]) == (TRACEPARENT.format("01"), None)
    assert await trace_of(client, ids["attribute"]) == (W3C, "a=1")
    assert await trace_of(client, ids["plain"]) == (None, None)
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'xray-batch'") == 3

    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])[
        "Messages"
    ]
    headers = {m["MessageId"]: m["Attributes"].get("AWSTraceHeader") for m in messages}
    assert headers == {ids["header"]: HEADER.format("1"), ids["attribute"]: W3C_AS_HEADER, ids["plain"]: None}


async def test_traceparent_message_attribute_is_the_jobs_trace(sqs, client):
    url = sqs.create_queue(QueueName="w3c")["QueueUrl"]
    attributes = {**strings(traceparent=W3C, tracestate="vendor=x,other=y"), **strings(to="ada")}
    sent = sqs.send_message(QueueUrl=url, MessageBody="hi", MessageAttributes=attributes)
    assert "MD5OfMessageSystemAttributes" not in sent
    assert await trace_of(client, sent["MessageId"]) == (W3C, "vendor=x,other=y")
    (message,) = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["AWSTraceHeader"]
    )["Messages"]
    # The attributes stay message attributes, as sent.
    assert message["MessageAttributes"] == attributes
    assert message["Attributes"] == {"AWSTraceHeader": W3C_AS_HEADER}

    # A traceparent that is not valid is no trace context (W3C: ignore it), and the message is sent.
    for bad in (
        "garbage",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    ):
        given = strings(traceparent=bad, tracestate="a=1")
        sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=given)
        assert await trace_of(client, sent["MessageId"]) == (None, None), bad
        (message,) = sqs.receive_message(
            QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
        )["Messages"]
        assert message["MessageAttributes"] == given
        assert "AWSTraceHeader" not in message["Attributes"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    # Only a String attribute; a tracestate that is not valid is dropped, the traceparent kept.
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="x",
        MessageAttributes={"traceparent": {"DataType": "Binary", "BinaryValue": W3C.encode()}},
    )
    assert await trace_of(client, sent["MessageId"]) == (None, None)
    sent = sqs.send_message(
        QueueUrl=url, MessageBody="x", MessageAttributes=strings(traceparent=W3C, tracestate="x" * 600)
    )
    assert await trace_of(client, sent["MessageId"]) == (W3C, None)


async def test_aws_trace_header_wins_over_the_attribute(sqs, client):
    url = sqs.create_queue(QueueName="both")["QueueUrl"]
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="x",
        MessageAttributes=strings(traceparent=W3C, tracestate="a=1"),
        MessageSystemAttributes=traced(HEADER.format("0")),
    )
    assert await trace_of(client, sent["MessageId"]) == (TRACEPARENT.format("00"), None)
    (message,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], AttributeNames=["All"])[
        "Messages"
    ]
    assert message["Attributes"]["AWSTraceHeader"] == HEADER.format("0")
    assert message["MessageAttributes"] == strings(traceparent=W3C, tracestate="a=1")


async def test_malformed_system_attributes_are_refused(sqs, db):
    url = sqs.create_queue(QueueName="refused")["QueueUrl"]
    parent = "Parent=53995c3f42cd8ad8"
    root = "Root=1-5759e988-bd862e3fe1be46a994272793"
    for system in (
        traced(root),  # no Parent
        traced(f"{parent};Sampled=1"),  # no Root
        traced(f"Root=2-5759e988-bd862e3fe1be46a994272793;{parent}"),  # not version 1
        traced(f"Root=1-5759e98-bd862e3fe1be46a9942727930;{parent}"),  # the parts' lengths
        traced(f"Root=1-5759e988-bd862e3fe1be46a99427279z;{parent}"),  # not hex
        traced(f"Root=1-00000000-000000000000000000000000;{parent}"),  # names no trace
        traced(f"{root};Parent=0000000000000000"),
        traced(f"{root};Parent=53995c3f42cd8ad"),
        traced(f"{root};{parent};Sampled=yes"),
        traced(f"{root};{parent};junk"),
        traced(""),
        {"AWSTraceHeader": {"DataType": "Number", "StringValue": "1"}},
        {"AWSTraceHeader": {"DataType": "Binary", "BinaryValue": f"{root};{parent}".encode()}},
        {"SenderId": {"DataType": "String", "StringValue": "me"}},  # only AWSTraceHeader may be sent
        {**traced(f"{root};{parent}"), "Other": {"DataType": "String", "StringValue": "x"}},
    ):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes=system)
        assert error_code(exc) == "InvalidParameterValue", system
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        message = exc.value.response["Error"]["Message"]
        assert "AWSTraceHeader" in message or "system attribute name" in message, message
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_a_traced_job_from_jobqs_api_is_received_with_aws_trace_header(sqs, client):
    url = sqs.create_queue(QueueName="from-api")["QueueUrl"]
    unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-02"  # flags without the sampled bit
    for traceparent in (W3C, unsampled, None):
        r = await client.post("/jobs", json={"queue": "from-api", "payload": "p", "traceparent": traceparent})
        assert r.status_code == 201
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["AWSTraceHeader"])[
        "Messages"
    ]
    assert [m.get("Attributes") for m in messages] == [
        {"AWSTraceHeader": W3C_AS_HEADER},
        {"AWSTraceHeader": W3C_AS_HEADER.replace("Sampled=1", "Sampled=0")},
        None,
    ]


async def test_the_x_ray_header_of_a_send_is_its_trace_header(sqs, client):
    """An X-Ray SDK sends the trace as the X-Amzn-Trace-Id header; SQS takes it as the AWSTraceHeader of
    a send that has none, and the system attribute wins over it."""
    url = sqs.create_queue(QueueName="xray-header")["QueueUrl"]

    def trace_header(request, **_):
        request.headers["X-Amzn-Trace-Id"] = HEADER.format("1")

    sqs.meta.events.register("before-send.sqs.SendMessage", trace_header)
    sqs.meta.events.register("before-send.sqs.SendMessageBatch", trace_header)
    sent = sqs.send_message(QueueUrl=url, MessageBody="by header")
    assert "MD5OfMessageSystemAttributes" not in sent  # no system attribute was sent
    assert await trace_of(client, sent["MessageId"]) == (TRACEPARENT.format("01"), None)
    own = sqs.send_message(QueueUrl=url, MessageBody="own", MessageSystemAttributes=traced(W3C_AS_HEADER))
    assert await trace_of(client, own["MessageId"]) == (W3C, None)
    (entry,) = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "batched"}])[
        "Successful"
    ]
    assert await trace_of(client, entry["MessageId"]) == (TRACEPARENT.format("01"), None)
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    headers = {m["Body"]: m["Attributes"]["AWSTraceHeader"] for m in received["Messages"]}
    assert headers == {"by header": HEADER.format("1"), "own": W3C_AS_HEADER, "batched": HEADER.format("1")}
