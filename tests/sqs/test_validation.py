"""What SQS takes and refuses in queue attributes, FIFO sends and batches, and message attribute names
(app/sqs/attributes.py, sending.py, fifo.py), and PurgeQueue forgetting a FIFO queue's deduplication
ids, each through boto3 in both wire formats (JSON 1.0 and the Query protocol): the error's code, HTTP
status and message where SQS's is known, and the state behind it."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from tests.sqs.clients import PROTOCOLS, client_for, query_model  # noqa: F401 - a fixture
from tests.waiting import states

pytestmark = pytest.mark.anyio

BAD_REQUEST = 400


@pytest.fixture(params=PROTOCOLS)
def sqs(request, service):
    return client_for(request, service)


def refusal(call, **kwargs) -> tuple[str, int, str]:
    """The code, HTTP status and message of the error SQS answers `call(**kwargs)` with."""
    with pytest.raises(ClientError) as exc:
        call(**kwargs)
    response = exc.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


def fifo_queue(sqs, name: str, **attributes: str) -> str:
    return sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]


def attributes_of(sqs, url: str, *names: str) -> dict[str, str]:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))["Attributes"]


def received(sqs, url: str) -> list[str]:
    """The bodies of what one receive hands out (up to 10)."""
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return sorted(m["Body"] for m in messages)


# --- point 3: attributes as SQS reads them -----------------------------------------------------------


async def test_boolean_attributes_are_read_in_any_case_and_kept_in_lower_case(sqs, db):
    url = fifo_queue(sqs, "bools.fifo", FifoQueue="TRUE", ContentBasedDeduplication="True")
    assert attributes_of(sqs, url, "FifoQueue", "ContentBasedDeduplication") == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
    }
    # Read, not only kept: the body's hash is the deduplication id.
    first = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    assert (
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")["MessageId"]
        == (first["MessageId"])
    )
    # The same queue asked for again in another case is the same queue, not QueueAlreadyExists.
    assert fifo_queue(sqs, "bools.fifo", ContentBasedDeduplication="tRuE") == url
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "FALSE"})
    assert attributes_of(sqs, url, "ContentBasedDeduplication") == {"ContentBasedDeduplication": "false"}
    code, status, _ = refusal(sqs.send_message, QueueUrl=url, MessageBody="other", MessageGroupId="g")
    assert (code, status) == ("InvalidParameterValue", BAD_REQUEST)
    kept = json.loads(await db.fetchval("SELECT sqs_attributes FROM jobq.queues WHERE name = 'bools.fifo'"))
    assert (kept["FifoQueue"], kept["ContentBasedDeduplication"]) == ("true", "false")

    standard = sqs.create_queue(QueueName="sse", Attributes={"SqsManagedSseEnabled": "True"})["QueueUrl"]
    assert attributes_of(sqs, standard, "SqsManagedSseEnabled") == {"SqsManagedSseEnabled": "true"}
    for name, bad, where in (
        ("ContentBasedDeduplication", "yes", url),
        ("SqsManagedSseEnabled", "maybe", standard),
    ):
        code, status, _ = refusal(sqs.set_queue_attributes, QueueUrl=where, Attributes={name: bad})
        assert (code, status) == ("InvalidAttributeValue", BAD_REQUEST), name


async def test_fifo_queue_false_on_a_standard_queue_is_an_unknown_attribute(sqs, db):
    for value in ("false", "False", "FALSE"):
        answer = refusal(sqs.create_queue, QueueName="plain", Attributes={"FifoQueue": value})
        assert answer == ("InvalidAttributeName", BAD_REQUEST, "Unknown Attribute FifoQueue."), value
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'plain'") == 0
    url = sqs.create_queue(QueueName="plain")["QueueUrl"]
    for value in ("true", "false"):
        answer = refusal(sqs.set_queue_attributes, QueueUrl=url, Attributes={"FifoQueue": value})
        assert answer == ("InvalidAttributeName", BAD_REQUEST, "Unknown Attribute FifoQueue."), value
    assert "FifoQueue" not in attributes_of(sqs, url, "All")


async def test_fifo_queue_true_on_a_fifo_queue_changes_nothing_and_false_is_refused(sqs, db):
    url = fifo_queue(sqs, "kind.fifo", ContentBasedDeduplication="true")
    before = attributes_of(sqs, url, "All")
    for value in ("true", "True"):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": value})
    after = attributes_of(sqs, url, "All")
    assert {k: v for k, v in after.items() if k != "LastModifiedTimestamp"} == {
        k: v for k, v in before.items() if k != "LastModifiedTimestamp"
    }
    for value in ("false", "FALSE"):
        answer = refusal(sqs.set_queue_attributes, QueueUrl=url, Attributes={"FifoQueue": value})
        assert answer == (
            "InvalidAttributeValue",
            BAD_REQUEST,
            "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.",
        ), value
    # Refused whole: the other attribute given with it is not set either.
    refusal(
        sqs.set_queue_attributes,
        QueueUrl=url,
        Attributes={"FifoQueue": "false", "ContentBasedDeduplication": "false"},
    )
    assert attributes_of(sqs, url, "FifoQueue", "ContentBasedDeduplication") == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
    }
    row = await db.fetchrow("SELECT key_concurrency, flow FROM jobq.queues WHERE name = 'kind.fifo'")
    assert tuple(row) == (1, True)


async def test_a_fifo_send_takes_a_delay_of_0_and_refuses_any_other(sqs):
    url = fifo_queue(sqs, "prompt.fifo", ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="one", MessageGroupId="a", DelaySeconds=0)
    sent = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "two", "MessageBody": "two", "MessageGroupId": "b", "DelaySeconds": 0}]
    )
    assert [s["Id"] for s in sent["Successful"]] == ["two"] and sent.get("Failed", []) == []
    assert received(sqs, url) == ["one", "two"]
    answer = refusal(sqs.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="a", DelaySeconds=5)
    assert answer == (
        "InvalidParameterValue",
        BAD_REQUEST,
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter that is not "
        "valid for this queue type.",
    )
    # 0 asks for no delay of the message's own: the queue's DelaySeconds still applies.
    delayed = fifo_queue(sqs, "later.fifo", ContentBasedDeduplication="true", DelaySeconds="60")
    sqs.send_message(QueueUrl=delayed, MessageBody="later", MessageGroupId="a", DelaySeconds=0)
    assert attributes_of(sqs, delayed, "ApproximateNumberOfMessagesDelayed") == {
        "ApproximateNumberOfMessagesDelayed": "1"
    }


RESERVED = ["AWS.trace", "aws.trace", "aWs.Trace", "Amazon.id", "AMAZON.id", "amazon.id"]
MISPLACED_PERIODS = [".leading", "trailing.", "two..dots", "."]


async def test_reserved_and_badly_dotted_message_attribute_names_are_refused(sqs, db):
    url = sqs.create_queue(QueueName="named")["QueueUrl"]
    for name in RESERVED + MISPLACED_PERIODS:
        attributes = {name: {"DataType": "String", "StringValue": "v"}}
        code, status, message = refusal(
            sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes=attributes
        )
        assert (code, status) == ("InvalidParameterValue", BAD_REQUEST), name
        assert f"Message (user) attribute name '{name}'" in message, name
        if name in RESERVED:
            assert "reserved" in message, name
    assert await states(db, "named")() == {}
    # Names that only look like them are fine.
    fine = {
        name: {"DataType": "String", "StringValue": "v"} for name in ("awsome", "Amazonian", "a.b", "x.AWS.y")
    }
    sqs.send_message(QueueUrl=url, MessageBody="fine", MessageAttributes=fine)
    # In a batch, an entry's attribute names fail that entry alone.
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "ok"},
            {
                "Id": "reserved",
                "MessageBody": "no",
                "MessageAttributes": {"aws.x": {"DataType": "String", "StringValue": "v"}},
            },
        ],
    )
    assert [s["Id"] for s in sent["Successful"]] == ["ok"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == [
        ("reserved", "InvalidParameterValue", True)
    ]
    assert await states(db, "named")() == {"pending": 2}


# --- point 4: batches and purges ---------------------------------------------------------------------


def entry(entry_id: str, **fields: str) -> dict[str, str]:
    return {"Id": entry_id, "MessageBody": entry_id, **fields}


async def test_a_fifo_batch_missing_a_group_or_a_deduplication_id_is_refused_whole(sqs, db):
    url = fifo_queue(sqs, "whole.fifo")
    good = entry("good", MessageGroupId="g", MessageDeduplicationId="d-good")
    answer = refusal(
        sqs.send_message_batch, QueueUrl=url, Entries=[good, entry("nogroup", MessageDeduplicationId="d2")]
    )
    assert answer == (
        "InvalidParameterValue",
        BAD_REQUEST,
        "The request must contain the parameter MessageGroupId.",
    )
    answer = refusal(
        sqs.send_message_batch, QueueUrl=url, Entries=[good, entry("nodedup", MessageGroupId="g")]
    )
    assert answer == (
        "InvalidParameterValue",
        BAD_REQUEST,
        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided "
        "explicitly",
    )
    # Nothing of either batch was sent, nor its deduplication ids kept.
    assert received(sqs, url) == []
    assert await states(db, "whole.fifo")() == {}
    assert await db.fetchval("SELECT count(*) FROM jobq.idempotency_keys") == 0
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[good])
    assert [s["Id"] for s in sent["Successful"]] == ["good"]
    assert received(sqs, url) == ["good"]
    # SendMessage's own answer to a missing group stays MissingParameter, as SQS's.
    code, status, _ = refusal(sqs.send_message, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert (code, status) == ("MissingParameter", BAD_REQUEST)

    # With content-based deduplication an entry needs no id, but still a group.
    content = fifo_queue(sqs, "content.fifo", ContentBasedDeduplication="true")
    sent = sqs.send_message_batch(
        QueueUrl=content, Entries=[entry("a", MessageGroupId="g"), entry("b", MessageGroupId="g")]
    )
    assert [s["Id"] for s in sent["Successful"]] == ["a", "b"]
    code, status, _ = refusal(
        sqs.send_message_batch, QueueUrl=content, Entries=[entry("c", MessageGroupId="g"), entry("d")]
    )
    assert (code, status) == ("InvalidParameterValue", BAD_REQUEST)
    assert await states(db, "content.fifo")() == {"pending": 2}


async def test_a_purge_forgets_the_fifo_queues_deduplication_ids(sqs, db):
    url = fifo_queue(sqs, "purged.fifo")
    grouped = fifo_queue(sqs, "purged-groups.fifo", DeduplicationScope="messageGroup")
    other = fifo_queue(sqs, "kept.fifo")
    firsts = {
        where: sqs.send_message(
            QueueUrl=where, MessageBody="first", MessageGroupId="g", MessageDeduplicationId="d"
        )
        for where in (url, grouped, other)
    }
    for where in (url, grouped):
        sqs.purge_queue(QueueUrl=where)
    # Sent again under the same id within the five minutes: a new message, received.
    for where in (url, grouped):
        again = sqs.send_message(
            QueueUrl=where, MessageBody="again", MessageGroupId="g", MessageDeduplicationId="d"
        )
        assert again["MessageId"] != firsts[where]["MessageId"]
        assert again["SequenceNumber"] != firsts[where]["SequenceNumber"]
        assert received(sqs, where) == ["again"]
    # Another queue's ids are its own: still a duplicate there.
    repeat = sqs.send_message(
        QueueUrl=other, MessageBody="again", MessageGroupId="g", MessageDeduplicationId="d"
    )
    assert repeat["MessageId"] == firsts[other]["MessageId"]
    assert await states(db, "kept.fifo")() == {"pending": 1}
    scopes = await db.fetch(
        "SELECT scope, count(*) AS n FROM jobq.idempotency_keys GROUP BY scope ORDER BY scope"
    )
    assert [(r["scope"], r["n"]) for r in scopes] == [
        ("sqs-dedup:kept.fifo", 1),
        ("sqs-dedup:purged-groups.fifo/g", 1),
        ("sqs-dedup:purged.fifo", 1),
    ]
