"""SQS's clock, not the lease-expiry loop's: a message is visible again the moment its visibility timeout
runs out, the receive that would take it past maxReceiveCount moves it into the dead-letter queue instead,
and a receive that got nothing answers without Messages. Through boto3 in both wire formats against a
service whose lease-expiry loop (which also moves dead letters) runs once an hour, after its first round
at start: what happens within a test is the receive's doing, and each test fails on a service that left
it to the loop. Times are read on the test's monotonic clock."""

from __future__ import annotations

import json
import time
from xml.etree import ElementTree

import pytest

from tests.sqs.clients import PROTOCOLS, client_for, query_model, sqs_client  # noqa: F401 - a fixture
from tests.waiting import states

pytestmark = pytest.mark.anyio

LOOP_INTERVAL = 3600.0  # the lease-expiry loop's, in seconds: it never runs within a test

# A sleep past a visibility timeout of 1 s, counted from the end of the receive that set it (its deadline
# is earlier): any delay of the test only takes it further past the deadline.
PAST_ONE_SECOND = 1.1

# A visibility timeout of 2 s ends 2 s after the receive's statement, which runs after the test reads
# `started` (so a receive again before started + 2.0 would be early, whatever the machine's load) and
# before it reads `received`. From there the long-poll that waits for it has 0.4 s to wake, run its few
# statements (the look at the queue's leases, the expiry, the lease, the message's attributes) and
# answer, on a loaded machine; a service that waited for the loop would answer nothing for an hour.
VISIBILITY = 2
LATE_BY_AT_MOST = 0.4


@pytest.fixture(params=PROTOCOLS)
def sqs(request, start_service):
    return client_for(request, start_service(expire_interval=LOOP_INTERVAL))


def queue_arn(sqs, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


async def test_the_receive_past_max_receive_count_moves_the_message_to_the_dead_letter_queue(sqs, db):
    dlq = sqs.create_queue(QueueName="late-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": queue_arn(sqs, dlq), "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName="late", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    kind = {"kind": {"DataType": "String", "StringValue": "poison"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="again and again", MessageAttributes=kind)["MessageId"]
    for count in ("1", "2"):
        answer = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, AttributeNames=["All"])
        (message,) = answer["Messages"]
        assert (message["MessageId"], message["Attributes"]["ApproximateReceiveCount"]) == (sent, count)
        time.sleep(PAST_ONE_SECOND)  # never deleted: visible again, and received again at once

    # The third receive would exceed maxReceiveCount: it moves the message and returns nothing.
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    assert await states(db, "late")() == {} and await states(db, "late-dlq")() == {"pending": 1}
    assert await db.fetchval("SELECT source FROM jobq.sqs_dead_letters") == "late"
    (dead,) = sqs.receive_message(QueueUrl=dlq, AttributeNames=["All"], MessageAttributeNames=["All"])[
        "Messages"
    ]
    assert (dead["MessageId"], dead["Body"], dead["MessageAttributes"]) == (sent, "again and again", kind)
    assert dead["Attributes"]["SentTimestamp"] == message["Attributes"]["SentTimestamp"]
    assert dead["Attributes"]["ApproximateReceiveCount"] == "1"


async def test_a_message_is_visible_again_when_its_visibility_timeout_runs_out(sqs, db):
    url = sqs.create_queue(QueueName="clock")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="tick")
    started = time.monotonic()
    (first,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=VISIBILITY)["Messages"]
    received = time.monotonic()
    # A long-poll from now: it waits for the lease's deadline, not for the loop to expire it.
    (again,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])["Messages"]
    back = time.monotonic()
    assert back - started >= VISIBILITY, "received again before its visibility timeout ran out"
    assert back - received <= VISIBILITY + LATE_BY_AT_MOST, back - received
    assert (again["MessageId"], again["Attributes"]["ApproximateReceiveCount"]) == (first["MessageId"], "2")

    # Fenced: the first receive's handle changes nothing of a message received again (README).
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=9)
    assert await states(db, "clock")() == {"running": 1}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert await states(db, "clock")() == {"completed": 1}


async def test_an_empty_receive_answers_without_messages(sqs):
    url = sqs.create_queue(QueueName="quiet")["QueueUrl"]
    wire: list[bytes] = []

    def keep(http_response, **_: object) -> None:
        wire.append(http_response.content)

    sqs.meta.events.register("after-call.sqs.ReceiveMessage", keep)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    (answer,) = wire
    if sqs.meta.service_model.protocol == "query":
        result = ElementTree.fromstring(answer).find("{*}ReceiveMessageResult")
        assert result is not None and list(result) == []  # <ReceiveMessageResult/>, no Message
    else:
        assert json.loads(answer) == {}


async def test_counts_see_a_message_visible_once_its_visibility_timeout_runs_out(start_service):
    sqs = sqs_client(start_service(expire_interval=LOOP_INTERVAL).url)
    url = sqs.create_queue(QueueName="counted")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="seen")
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"] == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "1",
    }
    time.sleep(PAST_ONE_SECOND)
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"] == {
        "ApproximateNumberOfMessages": "1",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


async def test_a_receive_expires_its_own_queues_leases_only(start_service, db):
    """What a receive makes visible is its queue's: another queue's overdue lease is the loop's to end,
    so a receive never does other queues' work, in batches, before answering."""
    sqs = sqs_client(start_service(expire_interval=LOOP_INTERVAL).url)
    mine, other = (sqs.create_queue(QueueName=name)["QueueUrl"] for name in ("mine", "other"))
    for url in (mine, other):
        sqs.send_message(QueueUrl=url, MessageBody="held")
        sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)
    time.sleep(PAST_ONE_SECOND)
    assert len(sqs.receive_message(QueueUrl=mine)["Messages"]) == 1
    assert await states(db, "mine")() == {"running": 1}
    still = "SELECT count(*) FROM jobq.jobs WHERE queue = 'other' AND status = 'running' AND attempts = 1"
    assert await db.fetchval(still) == 1  # overdue, not yet expired: no attempt counted on it
    assert len(sqs.receive_message(QueueUrl=other)["Messages"]) == 1
