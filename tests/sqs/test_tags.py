"""SQS queue tags and permissions (app/sqs/tags.py), through boto3 in both of SQS's wire formats: JSON 1.0
(current botocore) and the Query protocol (botocore on SQS's older model, tests/sqs/clients.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from botocore.exceptions import ClientError

from tests.sqs.clients import PROTOCOLS, client_for, query_model, sqs_client  # noqa: F401 - a fixture

pytestmark = pytest.mark.anyio


@pytest.fixture(params=PROTOCOLS)
def sqs(request, service):
    return client_for(request, service)


def attribute(sqs, url: str, name: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[name])["Attributes"][name]


def error_code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


async def test_tags(sqs, db):
    url = sqs.create_queue(QueueName="tagged", tags={"team": "payments", "cost-center": "42"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "payments", "cost-center": "42"}
    sqs.tag_queue(QueueUrl=url, Tags={"team": "billing", "env": ""})  # one replaced, one added
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing", "cost-center": "42", "env": ""}
    sqs.untag_queue(QueueUrl=url, TagKeys=["cost-center", "never-set"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing", "env": ""}
    stored = await db.fetchval("SELECT sqs_tags FROM jobq.queues WHERE name = 'tagged'")
    assert json.loads(stored) == {"team": "billing", "env": ""}
    # Tags are not attributes.
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "team" not in attributes and "Tags" not in attributes

    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "env"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)  # as SQS: no empty map
    assert await db.fetchval("SELECT sqs_tags FROM jobq.queues WHERE name = 'tagged'") is None
    # CreateQueue of an existing queue leaves its tags as they are.
    sqs.create_queue(QueueName="tagged", tags={"late": "yes"})
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)


async def test_tags_are_checked(sqs, db):
    url = sqs.create_queue(QueueName="strict")["QueueUrl"]
    for tags in ({"aws:reserved": "x"}, {"k" * 129: "x"}, {"k": "v" * 257}):
        with pytest.raises(ClientError) as exc:
            sqs.tag_queue(QueueUrl=url, Tags=tags)
        assert error_code(exc) == "InvalidParameterValue", tags
    sqs.tag_queue(QueueUrl=url, Tags={f"t{i}": "" for i in range(50)})
    with pytest.raises(ClientError) as exc:
        sqs.tag_queue(QueueUrl=url, Tags={"one-too-many": ""})
    assert error_code(exc) == "InvalidParameterValue" and "at most 50" in str(exc.value)
    assert len(sqs.list_queue_tags(QueueUrl=url)["Tags"]) == 50
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="badly-tagged", tags={"aws:x": "y"})
    assert await db.fetchval("SELECT count(*) FROM jobq.queues WHERE name = 'badly-tagged'") == 0
    with pytest.raises(ClientError) as exc:
        sqs.list_queue_tags(QueueUrl=url.replace("strict", "nosuch"))
    assert error_code(exc) in ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")


async def test_concurrent_tag_changes_all_land(sqs, service):
    """Each TagQueue reads, merges and writes the queue's tags under its row lock: none is lost."""
    url = sqs.create_queue(QueueName="busy")["QueueUrl"]
    clients = [sqs_client(service.url) for _ in range(8)]
    await asyncio.gather(
        *(asyncio.to_thread(c.tag_queue, QueueUrl=url, Tags={f"k{i}": str(i)}) for i, c in enumerate(clients))
    )
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {f"k{i}": str(i) for i in range(8)}


async def test_permissions_are_kept_in_the_queue_policy(sqs):
    url = sqs.create_queue(QueueName="shared")["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="partner", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    sqs.add_permission(
        QueueUrl=url,
        Label="auditors",
        AWSAccountIds=["444455556666", "777788889999"],
        Actions=["ReceiveMessage", "GetQueueAttributes"],
    )
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    assert policy["Id"] == "arn:aws:sqs:us-east-1:000000000000:shared/SQSDefaultPolicy"
    partner, auditors = policy["Statement"]
    assert partner == {
        "Sid": "partner",
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::111122223333:root"},
        "Action": "SQS:SendMessage",
        "Resource": "arn:aws:sqs:us-east-1:000000000000:shared",
    }
    assert auditors["Principal"]["AWS"] == [
        "arn:aws:iam::444455556666:root",
        "arn:aws:iam::777788889999:root",
    ]
    assert auditors["Action"] == ["SQS:ReceiveMessage", "SQS:GetQueueAttributes"]

    with pytest.raises(ClientError) as exc:
        sqs.add_permission(QueueUrl=url, Label="partner", AWSAccountIds=["111122223333"], Actions=["*"])
    assert error_code(exc) == "InvalidParameterValue" and "Already exists" in str(exc.value)
    for accounts, actions in ((["not-an-account"], ["SendMessage"]), (["111122223333"], ["DeleteQueue"])):
        with pytest.raises(ClientError) as exc:
            sqs.add_permission(QueueUrl=url, Label="bad", AWSAccountIds=accounts, Actions=actions)
        assert error_code(exc) == "InvalidParameterValue"

    sqs.remove_permission(QueueUrl=url, Label="partner")
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    assert [s["Sid"] for s in policy["Statement"]] == ["auditors"]
    with pytest.raises(ClientError) as exc:
        sqs.remove_permission(QueueUrl=url, Label="partner")
    assert error_code(exc) == "InvalidParameterValue" and "can't find label" in str(exc.value)
    sqs.remove_permission(QueueUrl=url, Label="auditors")
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
