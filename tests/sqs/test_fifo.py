"""SQS FIFO queues through boto3 against a live service (app/sqs/fifo.py): a queue per group in order and
one in flight, deduplication, sequence numbers, receive attempts, dead letters; the database checked
behind it."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from app.sqs.protocol import job_id_of
from tests.sqs.clients import sqs_client
from tests.waiting import equals, states, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def sqs(service):
    return sqs_client(service.url)


def fifo_queue(sqs, name: str, **attributes: str) -> str:
    return sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]


def refused(call, *args, **kwargs) -> ClientError:
    with pytest.raises(ClientError) as exc:
        call(*args, **kwargs)
    return exc.value


async def test_a_fifo_queue_is_one_in_flight_per_group_in_jobqs_settings(sqs, db):
    url = fifo_queue(sqs, "orders.fifo")
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: attributes[k] for k in attributes if k.startswith(("Fifo", "Content", "Dedup"))} == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "false",
        "DeduplicationScope": "queue",
        "FifoThroughputLimit": "perQueue",
    }
    assert attributes["MaximumMessageSize"] == "1048576"
    row = await db.fetchrow("SELECT key_concurrency, fair, flow FROM jobq.queues WHERE name = 'orders.fifo'")
    assert tuple(row) == (1, False, True)
    # Created again: fine with the same attributes, not with others.
    assert fifo_queue(sqs, "orders.fifo", ContentBasedDeduplication="false") == url
    assert error_code_of(refused(fifo_queue, sqs, "orders.fifo", ContentBasedDeduplication="true")) == (
        "QueueAlreadyExists"
    )
    # Names and FifoQueue go together, and FifoQueue is set once.
    assert error_code_of(refused(sqs.create_queue, QueueName="plain.fifo")) == "InvalidParameterValue"
    assert error_code_of(refused(fifo_queue, sqs, "plain")) == "InvalidParameterValue"
    assert error_code_of(refused(fifo_queue, sqs, "x" * 76 + ".fifo")) == "InvalidParameterValue"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "true"})  # a no-op, as in SQS
    assert error_code_of(
        refused(sqs.set_queue_attributes, QueueUrl=url, Attributes={"FifoQueue": "false"})
    ) == ("InvalidAttributeValue")
    # A standard queue has no FIFO attribute.
    standard = sqs.create_queue(QueueName="plain")["QueueUrl"]
    for call, kwargs in (
        (sqs.create_queue, {"QueueName": "plain2", "Attributes": {"ContentBasedDeduplication": "true"}}),
        (sqs.set_queue_attributes, {"QueueUrl": standard, "Attributes": {"DeduplicationScope": "queue"}}),
        (sqs.get_queue_attributes, {"QueueUrl": standard, "AttributeNames": ["FifoQueue"]}),
    ):
        assert error_code_of(refused(call, **kwargs)) == "InvalidAttributeName"
    assert (
        "FifoQueue" not in sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["All"])["Attributes"]
    )
    # FIFO attributes: their values, and high throughput's rule.
    for bad in (
        {"DeduplicationScope": "group"},
        {"ContentBasedDeduplication": "yes"},
        {"FifoThroughputLimit": "perMessageGroupId"},  # needs DeduplicationScope messageGroup
    ):
        assert error_code_of(refused(sqs.set_queue_attributes, QueueUrl=url, Attributes=bad)) == (
            "InvalidAttributeValue"
        )
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"},
    )
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DeduplicationScope", "FifoThroughputLimit"])
    assert got["Attributes"] == {
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    assert error_code_of(
        refused(sqs.set_queue_attributes, QueueUrl=url, Attributes={"DeduplicationScope": "queue"})
    ) == ("InvalidAttributeValue")


def error_code_of(error: ClientError) -> str:
    return error.response["Error"]["Code"]


async def test_what_a_fifo_send_needs_and_what_it_may_not_have(sqs, db):
    url = fifo_queue(sqs, "strict.fifo", DelaySeconds="0")
    standard = sqs.create_queue(QueueName="loose")["QueueUrl"]
    missing = refused(sqs.send_message, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert error_code_of(missing) == "MissingParameter" and "MessageGroupId" in str(missing)
    delayed = refused(
        sqs.send_message,
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        DelaySeconds=5,
    )
    assert error_code_of(delayed) == "InvalidParameterValue"
    no_id = refused(sqs.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert error_code_of(no_id) == "InvalidParameterValue"
    assert (
        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided"
        in (str(no_id))
    )
    bad_id = refused(
        sqs.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="a b"
    )
    assert error_code_of(bad_id) == "InvalidParameterValue"
    # A standard queue takes no deduplication id.
    assert error_code_of(
        refused(sqs.send_message, QueueUrl=standard, MessageBody="x", MessageDeduplicationId="d")
    ) == ("InvalidParameterValue")
    # In a batch, an entry's DelaySeconds fails that entry alone (an entry without a group refuses the
    # whole batch: tests/sqs/test_validation.py).
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "1", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {
                "Id": "delay",
                "MessageBody": "3",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "3",
                "DelaySeconds": 1,
            },
        ],
    )
    assert [s["Id"] for s in sent["Successful"]] == ["ok"]
    assert {f["Id"]: f["Code"] for f in sent["Failed"]} == {"delay": "InvalidParameterValue"}
    assert await states(db, "strict.fifo")() == {"pending": 1}
    # A batch's messages together are held to SQS's 1 MiB, as one message is.
    big = "x" * (600 * 1024)
    too_long = refused(
        sqs.send_message_batch,
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "MessageBody": big, "MessageGroupId": "g", "MessageDeduplicationId": f"big{i}"}
            for i in range(2)
        ],
    )
    assert error_code_of(too_long) == "AWS.SimpleQueueService.BatchRequestTooLong"


async def test_a_one_mib_message_works_on_either_kind_of_queue(sqs, db):
    """SQS's 1 MiB is the default limit, beside jobq's own 256 KiB payload limit for its API."""
    body = "é" * (512 * 1024)  # 1,048,576 bytes of UTF-8
    for url, extra in (
        (fifo_queue(sqs, "big.fifo", ContentBasedDeduplication="true"), {"MessageGroupId": "g"}),
        (sqs.create_queue(QueueName="big")["QueueUrl"], {}),
    ):
        sqs.send_message(QueueUrl=url, MessageBody=body, **extra)
        (message,) = sqs.receive_message(QueueUrl=url)["Messages"]
        assert message["Body"] == body
        assert error_code_of(refused(sqs.send_message, QueueUrl=url, MessageBody=body + "x", **extra)) == (
            "InvalidParameterValue"
        )
    # A queue's MaximumMessageSize lowers it.
    url = sqs.create_queue(QueueName="small", Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    assert (
        error_code_of(refused(sqs.send_message, QueueUrl=url, MessageBody="x" * 1025))
        == "InvalidParameterValue"
    )


async def test_deduplication_within_five_minutes_even_after_delete(sqs, service, db):
    url = fifo_queue(sqs, "once.fifo")
    first = sqs.send_message(
        QueueUrl=url, MessageBody="pay 10", MessageGroupId="acct-1", MessageDeduplicationId="p1"
    )
    # The same id again, even with another body: the first message's id and sequence number, nothing sent.
    again = sqs.send_message(
        QueueUrl=url, MessageBody="pay 11", MessageGroupId="acct-1", MessageDeduplicationId="p1"
    )
    assert (again["MessageId"], again["SequenceNumber"]) == (first["MessageId"], first["SequenceNumber"])
    assert await states(db, "once.fifo")() == {"pending": 1}
    (message,) = sqs.receive_message(QueueUrl=url)["Messages"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    after = sqs.send_message(
        QueueUrl=url, MessageBody="pay 10", MessageGroupId="acct-2", MessageDeduplicationId="p1"
    )
    assert after["MessageId"] == first["MessageId"]
    assert await states(db, "once.fifo")() == {"completed": 1}
    # Kept as an idempotency key of the queue's scope, for five minutes.
    kept = await db.fetchrow(
        "SELECT scope, ids, extract(epoch FROM expires_at - created_at) AS ttl FROM jobq.idempotency_keys"
        " WHERE key = 'p1'"
    )
    assert (kept["scope"], kept["ids"], kept["ttl"]) == (
        "sqs-dedup:once.fifo",
        [job_id_of(first["MessageId"])],
        300,
    )
    # Within a batch, an id repeated is a duplicate of its first message.
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "b1"},
            {"Id": "b", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "b1"},
            {"Id": "c", "MessageBody": "c", "MessageGroupId": "g", "MessageDeduplicationId": "p1"},
        ],
    )
    ids = {s["Id"]: s["MessageId"] for s in sent["Successful"]}
    assert ids["a"] == ids["b"] and ids["c"] == first["MessageId"]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 2
    # Past the interval, the id sends a new message.
    await db.execute(
        "UPDATE jobq.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'p1'"
    )
    new = sqs.send_message(
        QueueUrl=url, MessageBody="pay 10", MessageGroupId="acct-1", MessageDeduplicationId="p1"
    )
    assert new["MessageId"] != first["MessageId"]
    # Many senders of one id at once: one message, and each of them answered with it.
    clients = [sqs_client(service.url) for _ in range(8)]

    def send(client) -> str:
        return client.send_message(
            QueueUrl=url, MessageBody="race", MessageGroupId="r", MessageDeduplicationId="race"
        )["MessageId"]

    with ThreadPoolExecutor(len(clients)) as pool:
        answers = list(pool.map(send, clients * 3))
    assert len(set(answers)) == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE key = 'r'") == 1


async def test_content_based_deduplication_and_the_message_group_scope(sqs, db):
    url = fifo_queue(sqs, "content.fifo", ContentBasedDeduplication="true")
    one = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g1")
    assert (
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g2")["MessageId"]
        == one["MessageId"]
    )
    other = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="g1")
    assert other["MessageId"] != one["MessageId"]
    # An explicit id wins over the body's hash.
    explicit = sqs.send_message(
        QueueUrl=url, MessageBody="same", MessageGroupId="g1", MessageDeduplicationId="x"
    )
    assert explicit["MessageId"] not in (one["MessageId"], other["MessageId"])
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 3

    grouped = fifo_queue(sqs, "grouped.fifo", DeduplicationScope="messageGroup")
    a = sqs.send_message(QueueUrl=grouped, MessageBody="a", MessageGroupId="g1", MessageDeduplicationId="d")
    b = sqs.send_message(QueueUrl=grouped, MessageBody="b", MessageGroupId="g2", MessageDeduplicationId="d")
    assert a["MessageId"] != b["MessageId"]
    a2 = sqs.send_message(QueueUrl=grouped, MessageBody="a2", MessageGroupId="g1", MessageDeduplicationId="d")
    assert a2["MessageId"] == a["MessageId"]
    assert await states(db, "grouped.fifo")() == {"pending": 2}


async def test_sequence_numbers_increase_and_come_back_on_receive(sqs, db):
    # Job ids come from one sequence that every session draws from in turn (no per-session cache).
    assert await db.fetchval("SELECT cache_size FROM pg_sequences WHERE sequencename = 'jobs_id_seq'") == 1
    url = fifo_queue(sqs, "seq.fifo", ContentBasedDeduplication="true")
    numbers = [
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")["SequenceNumber"]
        for i in range(3)
    ]
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"b{i}", "MessageBody": f"b{i}", "MessageGroupId": "h"} for i in range(5)],
    )
    numbers += [s["SequenceNumber"] for s in batch["Successful"]]
    assert all(len(n) == 20 for n in numbers)
    assert [int(n) for n in numbers] == sorted({int(n) for n in numbers})
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    by_group: dict[str, list[str]] = {}
    for m in received["Messages"]:
        by_group.setdefault(m["Attributes"]["MessageGroupId"], []).append(m["Attributes"]["SequenceNumber"])
    assert by_group == {"g": numbers[:3], "h": numbers[3:]}  # each group's, in order
    # A standard queue has none.
    plain = sqs.create_queue(QueueName="plain")["QueueUrl"]
    assert "SequenceNumber" not in sqs.send_message(QueueUrl=plain, MessageBody="x")
    (message,) = sqs.receive_message(QueueUrl=plain, MessageSystemAttributeNames=["All"])["Messages"]
    assert "SequenceNumber" not in message["Attributes"]


async def test_order_per_group_with_concurrent_receivers(sqs, service, db):
    """Four receivers at once, three groups: every group's messages are processed one at a time and in
    order, also when a receiver gives a message back (visibility 0) instead of deleting it. A receive may
    hand out several messages of a group, in order; a receiver that gives one back gives back the group's
    later ones of that receive too, as an SQS FIFO consumer does to keep the order."""
    url = fifo_queue(sqs, "ledger.fifo", ContentBasedDeduplication="true")
    groups, per_group = ["a", "b", "c"], 15
    for n in range(per_group):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": g, "MessageBody": f"{g}:{n}", "MessageGroupId": g} for g in groups],
        )
    lock = threading.Lock()
    in_flight: set[str] = set()
    done: dict[str, list[int]] = {g: [] for g in groups}
    problems: list[str] = []
    given_back: set[str] = set()

    def receiver() -> None:
        client = sqs_client(service.url)
        while sum(map(len, done.values())) < len(groups) * per_group and not problems:
            messages = client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"]
            ).get("Messages", [])
            failed: set[str] = set()  # groups of this receive given back: their later messages go back too
            for message in messages:
                group, n = message["Body"].split(":")
                if group in failed:
                    client.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                    )
                    continue
                with lock:
                    if group in in_flight:
                        problems.append(f"two of group {group} in flight")
                    in_flight.add(group)
                    expected = len(done[group])
                    if int(n) != expected:
                        problems.append(f"group {group}: got {n}, expected {expected}")
                # Some messages fail once: they are given back and must come again before the next.
                fail = int(n) % 4 == 1 and message["Body"] not in given_back
                with lock:
                    in_flight.discard(group)  # before the call that frees the group
                    if fail:
                        given_back.add(message["Body"])
                    else:
                        done[group].append(int(n))
                if fail:
                    failed.add(group)
                    client.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                    )
                else:
                    client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(receiver) for _ in range(4))), timeout=120)
    assert problems == []
    assert done == {g: list(range(per_group)) for g in groups}
    assert await states(db, "ledger.fifo")() == {"completed": len(groups) * per_group}
    assert len(given_back) == len(groups) * len(range(1, per_group, 4))
    retried = await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE attempts >= 2")
    assert retried >= len(given_back)  # and the later messages given back with them


async def test_receive_request_attempt_id_gets_the_same_messages_again(sqs, service, db):
    url = fifo_queue(sqs, "attempts.fifo", ContentBasedDeduplication="true")
    for n in (1, 2):
        for g in ("a", "b", "c"):
            sqs.send_message(QueueUrl=url, MessageBody=f"{g}{n}", MessageGroupId=g)
    # Three slots: the first of each group, in the order they were sent.
    first = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=3, ReceiveRequestAttemptId="r1", VisibilityTimeout=20
    )
    handles = {m["Body"]: m["ReceiptHandle"] for m in first["Messages"]}
    assert sorted(handles) == ["a1", "b1", "c1"]
    await db.execute(
        "UPDATE jobq.jobs SET lease_expires_at = now() + interval '5 seconds' WHERE status = 'running'"
    )
    # The answer was lost; the SDK retries with the same attempt id: the same messages and handles, their
    # visibility started again (not received once more).
    again = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        ReceiveRequestAttemptId="r1",
        MessageSystemAttributeNames=["All"],
    )
    assert {m["Body"]: m["ReceiptHandle"] for m in again["Messages"]} == handles
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again["Messages"]} == {"1"}
    left = await db.fetch(
        "SELECT extract(epoch FROM lease_expires_at - now()) AS s FROM jobq.all_jobs WHERE status = 'running'"
    )
    assert all(25 < r["s"] <= 30 for r in left)  # the queue's visibility timeout, from now
    # Another attempt id gets what is free: nothing (each group has one in flight).
    assert sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="r2").get("Messages", []) == []
    # Once some are deleted, the rest; once none is in flight, the attempt id receives anew.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["a1"])
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, ReceiveRequestAttemptId="r1")["Messages"]
    assert sorted(m["Body"] for m in rest) == ["b1", "c1"]
    for m in rest:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    fresh = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, ReceiveRequestAttemptId="r1")[
        "Messages"
    ]
    assert sorted(m["Body"] for m in fresh) == ["a2", "b2", "c2"]
    kept = await db.fetchrow(
        "SELECT ids, extract(epoch FROM expires_at - created_at) AS ttl FROM jobq.sqs_receive_attempts"
        " WHERE queue = 'attempts.fifo' AND attempt_id = 'r1'"
    )
    assert sorted(kept["ids"]) == sorted(job_id_of(m["MessageId"]) for m in fresh) and kept["ttl"] == 300
    bad = refused(sqs.receive_message, QueueUrl=url, ReceiveRequestAttemptId="no spaces")
    assert error_code_of(bad) == "InvalidParameterValue"


async def test_concurrent_receives_with_one_attempt_id_get_one_answer(sqs, service, db):
    url = fifo_queue(sqs, "race.fifo", ContentBasedDeduplication="true")
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(g), "MessageBody": str(g), "MessageGroupId": str(g)} for g in range(10)],
    )
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(g), "MessageBody": str(g), "MessageGroupId": str(g)} for g in range(10, 20)],
    )
    clients = [sqs_client(service.url) for _ in range(2)]

    def receive(client) -> list[str]:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=random.choice([3, 5]), ReceiveRequestAttemptId="same"
        )["Messages"]
        return sorted(m["ReceiptHandle"] for m in messages)

    for _ in range(3):
        with ThreadPoolExecutor(2) as pool:
            one, two = pool.map(receive, clients)
        assert one == two
        running = await db.fetch("SELECT id, attempts FROM jobq.all_jobs WHERE status = 'running'")
        assert len(running) == len(one) and {r["attempts"] for r in running} == {1}  # the loser's handed back
        await db.execute(
            "UPDATE jobq.jobs SET status = 'completed', lease_expires_at = NULL WHERE status = 'running'"
        )
    # A standard queue ignores attempt ids, as SQS does.
    plain = sqs.create_queue(QueueName="plain")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=plain, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(2)])
    got = [
        sqs.receive_message(QueueUrl=plain, ReceiveRequestAttemptId="x")["Messages"][0]["Body"]
        for _ in range(2)
    ]
    assert sorted(got) == ["0", "1"]


async def test_fifo_dead_letters_keep_their_group(sqs, db):
    dlq = fifo_queue(sqs, "work-dlq.fifo")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    standard_dlq = sqs.get_queue_attributes(
        QueueUrl=sqs.create_queue(QueueName="plain-dlq")["QueueUrl"], AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    # A FIFO queue's dead-letter queue is FIFO, a standard queue's standard.
    wrong = json.dumps({"deadLetterTargetArn": standard_dlq, "maxReceiveCount": 2})
    assert (
        error_code_of(refused(fifo_queue, sqs, "work.fifo", RedrivePolicy=wrong)) == "InvalidAttributeValue"
    )
    assert error_code_of(
        refused(sqs.create_queue, QueueName="plain-work", Attributes={"RedrivePolicy": policy})
    ) == ("InvalidAttributeValue")
    url = fifo_queue(sqs, "work.fifo", RedrivePolicy=policy, ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="poison", MessageGroupId="g1")
    sqs.send_message(QueueUrl=url, MessageBody="next", MessageGroupId="g1")
    for receive in (1, 2):
        # Received and never deleted: it holds its group until received again, and goes dead after two.
        (message,) = (
            await asyncio.to_thread(
                sqs.receive_message,
                QueueUrl=url,
                MaxNumberOfMessages=1,
                VisibilityTimeout=1,
                WaitTimeSeconds=10,
                MessageSystemAttributeNames=["All"],
            )
        )["Messages"]
        assert (message["Body"], message["Attributes"]["ApproximateReceiveCount"]) == ("poison", str(receive))
    # Dead, it moves into the dead-letter queue, its group kept.
    await until(equals(states(db, "work-dlq.fifo"), {"pending": 1}))
    assert await states(db, "work.fifo")() == {"pending": 1}
    (message,) = (await asyncio.to_thread(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=5))["Messages"]
    assert message["Body"] == "next"  # the group goes on without its dead message
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert await db.fetchval("SELECT key FROM jobq.jobs WHERE queue = 'work-dlq.fifo'") == "g1"
    sqs.start_message_move_task(SourceArn=dlq_arn)
    (message,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["All"])["Messages"]
    assert (message["Body"], message["Attributes"]["MessageGroupId"]) == ("poison", "g1")


async def test_a_receive_takes_several_messages_of_a_group_in_order_and_holds_it(sqs, service, db):
    """As SQS hands them out: up to MaxNumberOfMessages of one group, in order, in one receive; while any
    of them is in flight, no other receive gets that group's messages."""
    url = fifo_queue(sqs, "batch.fifo", ContentBasedDeduplication="true")
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(n), "MessageBody": f"a:{n}", "MessageGroupId": "a"} for n in range(6)],
    )
    sqs.send_message(QueueUrl=url, MessageBody="b:0", MessageGroupId="b")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=4)["Messages"]
    assert [m["Body"] for m in got] == ["a:0", "a:1", "a:2", "a:3"]
    other = sqs_client(service.url)
    assert [m["Body"] for m in other.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]] == [
        "b:0"
    ]
    assert "Messages" not in other.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    for message in got[:3]:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert "Messages" not in other.receive_message(QueueUrl=url)  # a:3 still in flight holds the group
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[3]["ReceiptHandle"])
    rest = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["a:4", "a:5"]
