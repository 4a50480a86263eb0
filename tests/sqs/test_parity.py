"""Where jobq's SQS API once differed from SQS, each case as SQS behaves, through boto3 in both wire
formats (JSON 1.0 and the Query protocol), with the database checked behind."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from functools import partial

import httpx
import pytest
from botocore.exceptions import ClientError

from app.sqs.protocol import job_id_of, md5_of_attributes
from tests.sqs.clients import PROTOCOLS, client_for, query_model  # noqa: F401 - a fixture
from tests.waiting import equals, states, until

pytestmark = pytest.mark.anyio


@pytest.fixture(params=PROTOCOLS)
def sqs(request, service):
    return client_for(request, service)


def error_code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


async def test_a_queue_with_a_visibility_timeout_of_0_hands_messages_out_visible(sqs, db):
    url = sqs.create_queue(QueueName="glance", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {
        "VisibilityTimeout": "0"
    }
    sqs.send_message(QueueUrl=url, MessageBody="look")
    first = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    second = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    assert first["MessageId"] == second["MessageId"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in (first, second)] == ["1", "2"]
    assert await states(db, "glance")() == {"pending": 1}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])  # the latest receive's
    assert await states(db, "glance")() == {"completed": 1}

    # Back to a lasting visibility: a received message stays hidden.
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "45"})
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {
        "VisibilityTimeout": "45"
    }
    assert await db.fetchval("SELECT visibility_timeout FROM jobq.queues WHERE name = 'glance'") == 45
    sqs.send_message(QueueUrl=url, MessageBody="hidden")
    assert len(sqs.receive_message(QueueUrl=url)["Messages"]) == 1
    assert not sqs.receive_message(QueueUrl=url).get("Messages")


async def test_a_receive_with_a_visibility_timeout_of_0_leaves_the_message_visible(sqs, db):
    url = sqs.create_queue(QueueName="peek")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="still there")
    (peeked,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    (taken,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    assert peeked["MessageId"] == taken["MessageId"]
    assert await states(db, "peek")() == {"running": 1}
    # A receive with 0 counts as a receive: past maxReceiveCount the message is dead, as SQS redrives it.
    dlq = sqs.create_queue(QueueName="peek-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": 1}}'
    once = sqs.create_queue(QueueName="peek-once", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sqs.send_message(QueueUrl=once, MessageBody="one look")
    assert len(sqs.receive_message(QueueUrl=once, VisibilityTimeout=0)["Messages"]) == 1
    # Dead, then moved into the dead-letter queue by the next lease-expiry round (every 0.2 s here), which
    # may come before a look at the dead state: the message is waited for where it ends.
    await until(equals(states(db, "peek-dlq"), {"pending": 1}))
    assert await states(db, "peek-once")() == {}
    assert await db.fetchval("SELECT source FROM jobq.sqs_dead_letters") == "peek-once"
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="negative", Attributes={"VisibilityTimeout": "-1"})
    assert error_code(exc) == "InvalidAttributeValue"


async def test_messages_past_the_retention_period_are_not_received(sqs, db):
    url = sqs.create_queue(QueueName="fleeting", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    old = sqs.send_message(QueueUrl=url, MessageBody="stale")["MessageId"]
    fresh = sqs.send_message(QueueUrl=url, MessageBody="fresh")["MessageId"]
    # Sent 61 s ago, as far as the database knows.
    await db.execute(
        "UPDATE jobq.jobs SET created_at = created_at - interval '61 seconds' WHERE id = $1", job_id_of(old)
    )
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["MessageId"] for m in received] == [fresh]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE id = $1", job_id_of(old)) == 0

    # Only expired messages in the queue: the receive waits out its wait for a fresh one, then finds none.
    alone = sqs.send_message(QueueUrl=url, MessageBody="stale too")["MessageId"]
    await db.execute(
        "UPDATE jobq.jobs SET created_at = created_at - interval '61 seconds' WHERE id = $1", job_id_of(alone)
    )
    assert not sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")
    assert await states(db, "fleeting")() == {"running": 1}  # the fresh one, still in flight

    # A queue without a MessageRetentionPeriod keeps its messages (jobq's own jobs, too) until done.
    kept = sqs.create_queue(QueueName="kept")["QueueUrl"]
    aged = sqs.send_message(QueueUrl=kept, MessageBody="old but wanted")["MessageId"]
    await db.execute(
        "UPDATE jobq.jobs SET created_at = now() - interval '30 days' WHERE id = $1", job_id_of(aged)
    )
    assert [m["MessageId"] for m in sqs.receive_message(QueueUrl=kept)["Messages"]] == [aged]


async def test_a_deleted_queue_name_is_held_for_a_minute(sqs, db):
    url = sqs.create_queue(QueueName="short-lived")["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="short-lived")
    assert error_code(exc) in ("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'short-lived'") == 0
    sqs.create_queue(QueueName="other-name")  # only that name is held
    # A minute on (as far as the database knows), the name is free again.
    await db.execute("UPDATE jobq.sqs_deleted_queues SET deleted_at = deleted_at - interval '61 seconds'")
    assert sqs.create_queue(QueueName="short-lived")["QueueUrl"] == url


async def test_one_purge_a_minute(sqs, db):
    url = sqs.create_queue(QueueName="purged")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="first")
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="second")
    with pytest.raises(ClientError) as exc:
        sqs.purge_queue(QueueUrl=url)
    assert error_code(exc) in ("PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert await states(db, "purged")() == {"pending": 1}  # the second message outlived the refusal
    await db.execute("UPDATE jobq.queues SET sqs_purged_at = sqs_purged_at - interval '61 seconds'")
    sqs.purge_queue(QueueUrl=url)
    assert await states(db, "purged")() == {}


async def test_message_attribute_names_and_values_as_sqs_takes_them(sqs):
    url = sqs.create_queue(QueueName="attributed")["QueueUrl"]
    unicode = {"attr.1øßä": {"DataType": "String", "StringValue": "v"}}
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=unicode)
    (message,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert message["MessageAttributes"] == unicode
    with pytest.raises(ClientError) as exc:
        sqs.send_message(
            QueueUrl=url,
            MessageBody="x",
            MessageAttributes={"a": {"DataType": "String", "StringValue": "bell\x07"}},
        )
    assert error_code(exc) == "InvalidParameterValue"


async def test_changing_the_visibility_of_a_message_as_sqs_answers_it(sqs, db):
    url = sqs.create_queue(QueueName="seen")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    (message,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    handle = message["ReceiptHandle"]
    # Its visibility ran out (the lease expired, as far as the database knows) and nobody received it
    # since: the handle takes it back, in flight again, the receive not counted twice.
    await db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 second'")
    await until(equals(states(db, "seen"), {"pending": 1}))
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)
    row = await db.fetchrow("SELECT status, attempts, lease_expires_at > now() AS later FROM jobq.jobs")
    assert tuple(row) == ("running", 1, True)
    assert not sqs.receive_message(QueueUrl=url).get("Messages")  # hidden again
    # Deleted: its visibility can no longer change.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)
    assert error_code(exc) == "InvalidParameterValue" and "Message does not exist" in str(exc.value)
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    assert error_code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert 'The input receipt handle "not-a-handle" is not a valid receipt handle.' in str(exc.value)


async def test_message_ids_are_uuids_that_name_their_job(sqs, db):
    url = sqs.create_queue(QueueName="identified")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="a")["MessageId"]
    (batched,) = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "b"}])["Successful"]
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert {m["MessageId"] for m in received} == {sent, batched["MessageId"]}
    for message_id in (sent, batched["MessageId"]):
        assert uuid.UUID(message_id).version == 4 and str(uuid.UUID(message_id)) == message_id
    rows = await db.fetch("SELECT id, payload #>> '{}' AS body FROM jobq.all_jobs ORDER BY id")
    assert [(r["id"], r["body"]) for r in rows] == [
        (job_id_of(sent), "a"),
        (job_id_of(batched["MessageId"]), "b"),
    ]


async def test_queue_urls_in_every_form_clients_build(sqs, db):
    """jobq is one region (docs/how-to/sqs.md): a queue URL names its queue by its last segment,
    whatever host and account the client put before it."""
    sqs.create_queue(QueueName="anywhere")
    for url in (
        "https://sqs.eu-west-1.amazonaws.com/123456789012/anywhere",
        "https://eu-west-1.queue.amazonaws.com/123456789012/anywhere",
        "http://localhost:4566/000000000000/anywhere",
        "http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/anywhere/",
    ):
        sqs.send_message(QueueUrl=url, MessageBody=url)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE queue = 'anywhere'") == 4


async def test_dead_letters_move_to_the_dead_letter_queue_and_back(sqs, service, db):
    dlq_url = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
    dlq = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    sent = sqs.send_message(QueueUrl=url, MessageBody="poison")["MessageId"]
    for _ in range(2):  # received twice and never deleted: each visibility of 1 s runs out
        receive = partial(sqs.receive_message, QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=10)
        assert len((await asyncio.to_thread(receive))["Messages"]) == 1
    # Past maxReceiveCount: received from the dead-letter queue, as in SQS, and gone from its own.
    receive = partial(sqs.receive_message, QueueUrl=dlq_url, WaitTimeSeconds=10, VisibilityTimeout=60)
    (dead,) = (await asyncio.to_thread(receive))["Messages"]
    assert (dead["MessageId"], dead["Body"]) == (sent, "poison")
    assert await states(db, "work")() == {} and await states(db, "work-dlq")() == {"running": 1}
    assert not sqs.receive_message(QueueUrl=url).get("Messages")

    # Visible again in the dead-letter queue, then moved back to where it came from, received anew.
    sqs.change_message_visibility(QueueUrl=dlq_url, ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0)
    task = sqs.start_message_move_task(SourceArn=dlq)["TaskHandle"]
    (listed,) = sqs.list_message_move_tasks(SourceArn=dlq)["Results"]
    assert (listed["TaskHandle"], listed["Status"], listed["ApproximateNumberOfMessagesMoved"]) == (
        task,
        "COMPLETED",
        1,
    )
    assert await states(db, "work")() == {"pending": 1} and await states(db, "work-dlq")() == {}
    (back,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert (back["MessageId"], back["Body"], back["Attributes"]["ApproximateReceiveCount"]) == (
        sent,
        "poison",
        "1",
    )
    assert await db.fetchval("SELECT count(*) FROM jobq.sqs_dead_letters") == 0


async def test_without_a_dead_letter_queue_dead_jobs_stay_for_jobqs_dead_letter_api(sqs, service, db):
    """A RedrivePolicy naming a queue that does not exist, or none: dead jobs stay dead in their queue,
    listed by GET /dead, as for any jobq queue."""
    policy = json.dumps(
        {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:nowhere", "maxReceiveCount": 1}
    )
    url = sqs.create_queue(QueueName="orphan", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="dies")
    # A receive with a visibility of 0 counts (the message is past maxReceiveCount at once).
    assert len(sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]) == 1
    await until(equals(states(db, "orphan"), {"dead": 1}))
    # A redrive round after it died leaves it where it is. That one has run shows in another queue whose
    # dead-letter queue exists: a message that dies there now is moved by such a round.
    dlq = sqs.create_queue(QueueName="witness-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    witness_policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    witness = sqs.create_queue(QueueName="witness", Attributes={"RedrivePolicy": witness_policy})["QueueUrl"]
    sqs.send_message(QueueUrl=witness, MessageBody="moved")
    assert len(sqs.receive_message(QueueUrl=witness, VisibilityTimeout=0)["Messages"]) == 1
    await until(equals(states(db, "witness-dlq"), {"pending": 1}))
    assert await states(db, "orphan")() == {"dead": 1}
    async with httpx.AsyncClient(base_url=service.url) as http:
        (listed,) = (await http.get("/dead", params={"queue": "orphan"})).json()["jobs"]
    assert listed["payload"] == "dies"


async def test_what_sqs_refuses_is_refused(sqs):
    url = sqs.create_queue(QueueName="checked")["QueueUrl"]
    for group in ("", " ", "g" * 129):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId=group)
        assert error_code(exc) == "InvalidParameterValue", group
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")  # a FIFO queue's
    assert error_code(exc) == "InvalidParameterValue"
    for attributes in ({"ContentBasedDeduplication": "true"}, {"FifoThroughputLimit": "perQueue"}):
        with pytest.raises(ClientError) as exc:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
        assert error_code(exc) == "InvalidAttributeName"
    big = [{"Id": str(i), "MessageBody": "x" * 200_000} for i in range(6)]  # each fits, together not
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=big)
    assert error_code(exc) in ("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong")


async def test_a_send_with_system_attributes_answers_their_digest(sqs):
    url = sqs.create_queue(QueueName="digested")["QueueUrl"]
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes=system)
    assert sent["MD5OfMessageSystemAttributes"] == md5_of_attributes(system)


async def test_the_x_ray_header_is_a_sends_trace_header(sqs):
    """In either wire format (the JSON one in full in tests/sqs/test_trace_context.py)."""
    url = sqs.create_queue(QueueName="traced")["QueueUrl"]
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"

    def trace(request, **_):
        request.headers["X-Amzn-Trace-Id"] = header

    sqs.meta.events.register("before-send.sqs.SendMessage", trace)
    sqs.send_message(QueueUrl=url, MessageBody="x")
    (message,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert message["Attributes"]["AWSTraceHeader"] == header


async def test_a_receipt_handle_of_another_queue_changes_nothing(sqs, db):
    """SQS answers ReceiptHandleIsInvalid to a handle that another queue's receive handed out."""
    a = sqs.create_queue(QueueName="handles-a")["QueueUrl"]
    b = sqs.create_queue(QueueName="handles-b")["QueueUrl"]
    sqs.send_message(QueueUrl=a, MessageBody="a's")
    sqs.send_message(QueueUrl=b, MessageBody="b's")
    (mine,) = sqs.receive_message(QueueUrl=a, VisibilityTimeout=300)["Messages"]
    (theirs,) = sqs.receive_message(QueueUrl=b, VisibilityTimeout=300)["Messages"]
    # The handle, and the same without the queue its lease token names (as tokens were spelled once).
    handle = theirs["ReceiptHandle"]
    job, token = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode().split(":", 1)
    bare = base64.urlsafe_b64encode(f"{job}:{token.split('.')[0]}".encode()).decode().rstrip("=")
    lease = "SELECT status, attempts, lease_expires_at FROM jobq.all_jobs WHERE queue = 'handles-b'"
    before = tuple(await db.fetchrow(lease))
    for other in (handle, bare):
        for call, kwargs in (
            (sqs.delete_message, {}),
            (sqs.change_message_visibility, {"VisibilityTimeout": 600}),
            (sqs.change_message_visibility, {"VisibilityTimeout": 0}),
        ):
            with pytest.raises(ClientError) as exc:
                call(QueueUrl=a, ReceiptHandle=other, **kwargs)
            assert error_code(exc) == "ReceiptHandleIsInvalid", (call, other)
    entries = [{"Id": "theirs", "ReceiptHandle": handle}, {"Id": "bare", "ReceiptHandle": bare}]
    mine_entry = {"Id": "mine", "ReceiptHandle": mine["ReceiptHandle"]}
    changed = sqs.change_message_visibility_batch(
        QueueUrl=a, Entries=[{**e, "VisibilityTimeout": 600} for e in [*entries, mine_entry]]
    )
    deleted = sqs.delete_message_batch(QueueUrl=a, Entries=[*entries, mine_entry])
    for answer in (changed, deleted):
        assert [e["Id"] for e in answer["Successful"]] == ["mine"]
        assert sorted((e["Id"], e["Code"], e["SenderFault"]) for e in answer["Failed"]) == [
            ("bare", "ReceiptHandleIsInvalid", True),
            ("theirs", "ReceiptHandleIsInvalid", True),
        ]
    # A handle made up to name queue a with b's message says no more than of a message that does not
    # exist: not that b's message is in flight.
    forged = base64.urlsafe_b64encode(f"{job}:{uuid.uuid4()}.handles-a".encode()).decode().rstrip("=")
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(QueueUrl=a, ReceiptHandle=forged, VisibilityTimeout=600)
    assert error_code(exc) == "InvalidParameterValue"
    assert "does not exist" in exc.value.response["Error"]["Message"]
    assert tuple(await db.fetchrow(lease)) == before == ("running", 1, before[2])
    assert await states(db, "handles-a")() == {"completed": 1}
    # On its own queue the handle works.
    sqs.delete_message(QueueUrl=b, ReceiptHandle=handle)
    assert await states(db, "handles-b")() == {"completed": 1}
