"""Regions as part of an SQS queue's identity (app/sqs/regions.py): the same name in two regions is two
queues, with two URLs and two ARNs, across every action; a URL or ARN of another region names no queue of
the request's; dead letters and move tasks stay in their region. Through boto3 in both wire formats, signed
for each region as SDKs sign, against a real service; what each action did is checked in the database."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.sqs.clients import PROTOCOLS, make_client, query_model  # noqa: F401 - a fixture
from tests.waiting import states

pytestmark = pytest.mark.anyio

EAST, WEST = "us-east-1", "eu-west-1"
KEY, SECRET = "AKIAREGIONS", "regions-secret"
CREDENTIALS = {
    KEY: {"secret": SECRET, "role": "admin"},
    # Queue patterns match jobq's names: "orders" is the default region's queue only.
    "AKIAEASTORDERS": {"secret": "east-secret", "role": "admin", "queues": ["orders"]},
    "AKIAALLORDERS": {"secret": "all-secret", "role": "admin", "queues": ["orders", "*:orders"]},
}


@pytest.fixture(params=PROTOCOLS)
def protocol(request):
    return request.param


@pytest.fixture
def regional(start_service):
    """A service with keys that serves two regions, us-east-1 first."""
    return start_service(aws_credentials=CREDENTIALS, aws_regions=[EAST, WEST])


@pytest.fixture
def clients(request, regional, protocol):
    """A client of `regional` per region, in the test's wire format."""
    model = request.getfixturevalue("query_model") if protocol == "query" else None
    return {
        region: make_client(regional.url, key=KEY, secret=SECRET, region=region, model=model)
        for region in (EAST, WEST)
    }


def code(call, **kwargs) -> str:
    with pytest.raises(ClientError) as refused:
        call(**kwargs)
    return refused.value.response["Error"]["Code"]


def arn(client, url: str) -> str:
    return client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def bodies(client, url: str) -> list[str]:
    """The bodies of what one receive of up to 10 messages gets."""
    answer = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    return [m["Body"] for m in answer.get("Messages", [])]


async def names(db) -> list[str]:
    return [r["name"] for r in await db.fetch("SELECT name FROM jobq.queues ORDER BY name")]


async def test_the_same_name_in_two_regions_is_two_queues(regional, clients, db):
    east, west = clients[EAST], clients[WEST]
    east_url = east.create_queue(QueueName="orders", tags={"team": "east"})["QueueUrl"]
    west_url = west.create_queue(QueueName="orders", Attributes={"DelaySeconds": "0"})["QueueUrl"]
    east.create_queue(QueueName="only-east")
    assert east_url == f"{regional.url}/000000000000/orders"
    assert west_url == f"{regional.url}/queue/{WEST}/000000000000/orders"
    assert arn(east, east_url) == f"arn:aws:sqs:{EAST}:000000000000:orders"
    assert arn(west, west_url) == f"arn:aws:sqs:{WEST}:000000000000:orders"
    assert await names(db) == [f"{WEST}:orders", "only-east", "orders"]

    # Each region finds and lists its own queues only.
    assert east.get_queue_url(QueueName="orders")["QueueUrl"] == east_url
    assert west.get_queue_url(QueueName="orders")["QueueUrl"] == west_url
    assert code(west.get_queue_url, QueueName="only-east") == "AWS.SimpleQueueService.NonExistentQueue"
    assert east.list_queues()["QueueUrls"] == [f"{regional.url}/000000000000/only-east", east_url]
    assert west.list_queues()["QueueUrls"] == [west_url]
    assert west.list_queues(QueueNamePrefix="ord")["QueueUrls"] == [west_url]
    assert "QueueUrls" not in west.list_queues(QueueNamePrefix="only")
    page = east.list_queues(MaxResults=1)
    assert page["QueueUrls"] == [f"{regional.url}/000000000000/only-east"]
    assert east.list_queues(MaxResults=1, NextToken=page["NextToken"])["QueueUrls"] == [east_url]

    # Messages, attributes and tags are each queue's own.
    east.send_message(QueueUrl=east_url, MessageBody="for the east")
    west.send_message_batch(
        QueueUrl=west_url, Entries=[{"Id": str(i), "MessageBody": f"west {i}"} for i in range(2)]
    )
    assert await states(db, "orders")() == {"pending": 1}
    assert await states(db, f"{WEST}:orders")() == {"pending": 2}
    assert east.list_queue_tags(QueueUrl=east_url)["Tags"] == {"team": "east"}
    assert "Tags" not in west.list_queue_tags(QueueUrl=west_url)
    west.tag_queue(QueueUrl=west_url, Tags={"team": "west"})
    assert east.list_queue_tags(QueueUrl=east_url)["Tags"] == {"team": "east"}
    counts = west.get_queue_attributes(QueueUrl=west_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert counts["Attributes"]["ApproximateNumberOfMessages"] == "2"
    assert sorted(bodies(west, west_url)) == ["west 0", "west 1"]
    assert bodies(east, east_url) == ["for the east"]

    # Purging and deleting one leaves the other.
    west.purge_queue(QueueUrl=west_url)
    assert await states(db, "orders")() == {"running": 1}
    west.delete_queue(QueueUrl=west_url)
    assert await names(db) == ["only-east", "orders"]
    assert east.get_queue_url(QueueName="orders")["QueueUrl"] == east_url


async def test_a_url_of_another_region_names_no_queue_of_the_requests(regional, clients, db):
    east, west = clients[EAST], clients[WEST]
    east_url = east.create_queue(QueueName="orders")["QueueUrl"]
    west_url = west.create_queue(QueueName="orders")["QueueUrl"]
    # As SQS answers a queue URL of another region than the one the request is signed for.
    missing = "AWS.SimpleQueueService.NonExistentQueue"
    aws_east = f"https://sqs.{EAST}.amazonaws.com/1/orders"
    assert code(west.send_message, QueueUrl=aws_east, MessageBody="x") == missing
    assert code(east.send_message, QueueUrl=west_url, MessageBody="x") == missing
    assert code(east.delete_queue, QueueUrl=west_url) == missing
    assert await states(db, "orders")() == {} and await states(db, f"{WEST}:orders")() == {}

    # A URL without a region names the queue of the request's region; one of AWS's hosts names its own.
    west.send_message(QueueUrl=east_url, MessageBody="region-free")
    for host in (f"sqs.{WEST}.amazonaws.com", f"{WEST}.queue.amazonaws.com"):
        west.send_message(QueueUrl=f"https://{host}/123456789012/orders", MessageBody=host)
    assert await states(db, f"{WEST}:orders")() == {"pending": 3}
    assert await states(db, "orders")() == {}

    # A signature for a region the service does not serve is refused, whatever the URL.
    other = make_client(regional.url, key=KEY, secret=SECRET, region="ap-south-1")
    assert code(other.list_queues) == "SignatureDoesNotMatch"


async def test_a_keys_queue_patterns_name_each_regions_queues(regional, db):
    east_only = make_client(regional.url, key="AKIAEASTORDERS", secret="east-secret", region=WEST)
    everywhere = make_client(regional.url, key="AKIAALLORDERS", secret="all-secret", region=WEST)
    assert code(east_only.create_queue, QueueName="orders") == "AccessDenied"
    assert await names(db) == []
    url = everywhere.create_queue(QueueName="orders")["QueueUrl"]
    assert code(east_only.send_message, QueueUrl=url, MessageBody="x") == "AccessDenied"
    assert await names(db) == [f"{WEST}:orders"] and await states(db, f"{WEST}:orders")() == {}
    assert everywhere.list_queues()["QueueUrls"] == [url]
    assert "QueueUrls" not in east_only.list_queues()


async def test_dead_letters_and_move_tasks_stay_in_their_region(regional, clients, db):
    east, west = clients[EAST], clients[WEST]
    east_dlq = east.create_queue(QueueName="dlq")["QueueUrl"]
    west_dlq = west.create_queue(QueueName="dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn(west, west_dlq), "maxReceiveCount": 1})
    # A dead-letter queue is in its queue's region, as in SQS: the other region's is refused, nothing made.
    assert (
        code(east.create_queue, QueueName="work", Attributes={"RedrivePolicy": policy})
        == "InvalidParameterValue"
    )
    assert await names(db) == ["dlq", f"{WEST}:dlq"]
    work = west.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    shown = west.get_queue_attributes(QueueUrl=work, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(shown["RedrivePolicy"]) == {
        "deadLetterTargetArn": arn(west, west_dlq),
        "maxReceiveCount": 1,
    }
    # Creating it again with the same policy is no change.
    assert west.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy})["QueueUrl"] == work

    west.send_message(QueueUrl=work, MessageBody="poison")
    (message,) = west.receive_message(QueueUrl=work, VisibilityTimeout=1)["Messages"]
    assert message["Body"] == "poison"
    time.sleep(1.1)  # past its visibility timeout: visible again
    assert bodies(west, work) == []  # the receive past maxReceiveCount moves it
    assert await states(db, f"{WEST}:dlq")() == {"pending": 1}
    assert await states(db, "dlq")() == {}
    assert west.list_dead_letter_source_queues(QueueUrl=west_dlq)["queueUrls"] == [work]
    assert east.list_dead_letter_source_queues(QueueUrl=east_dlq).get("queueUrls", []) == []

    # A move task names its queues by ARN, in the request's region.
    assert code(east.start_message_move_task, SourceArn=arn(west, west_dlq)) == "InvalidParameterValue"
    task = west.start_message_move_task(SourceArn=arn(west, west_dlq))["TaskHandle"]
    (listed,) = west.list_message_move_tasks(SourceArn=arn(west, west_dlq))["Results"]
    assert (listed["TaskHandle"], listed["ApproximateNumberOfMessagesMoved"]) == (task, 1)
    assert await states(db, f"{WEST}:work")() == {"pending": 1}
    assert await states(db, f"{WEST}:dlq")() == {}


async def test_a_service_without_keys_reads_an_unlisted_region_as_its_first(start_service, db):
    service = start_service(aws_regions=[EAST, WEST])
    anywhere = make_client(service.url, region="ap-south-1")
    west = make_client(service.url, region=WEST)
    url = anywhere.create_queue(QueueName="orders")["QueueUrl"]
    assert url == f"{service.url}/000000000000/orders"
    assert arn(anywhere, url) == f"arn:aws:sqs:{EAST}:000000000000:orders"
    west_url = west.create_queue(QueueName="orders")["QueueUrl"]
    assert await names(db) == [f"{WEST}:orders", "orders"]

    # An unsigned request acts in the region its queue URL names.
    unsigned = httpx.post(
        f"{service.url}/",
        headers={"X-Amz-Target": "AmazonSQS.SendMessage", "Content-Type": "application/x-amz-json-1.0"},
        json={"QueueUrl": west_url, "MessageBody": "unsigned"},
    )
    assert unsigned.status_code == 200, unsigned.text
    assert await states(db, f"{WEST}:orders")() == {"pending": 1}
    assert await states(db, "orders")() == {}


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_a_query_request_at_a_regional_queue_url(regional, db, method):
    """The Query protocol sent to the queue's own URL, as the AWS SDK for Java 1.x sends it."""
    west = make_client(regional.url, key=KEY, secret=SECRET, region=WEST)
    url = west.create_queue(QueueName="java")["QueueUrl"]
    params = {"Action": "SendMessage", "MessageBody": f"by {method}", "Version": "2012-11-05"}
    if method == "POST":
        request = AWSRequest(method="POST", url=url, data=params)
        request.headers["Content-Type"] = "application/x-www-form-urlencoded"
    else:
        request = AWSRequest(method="GET", url=url, params=params)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", WEST).add_auth(request)
    prepared = request.prepare()
    answer = httpx.request(method, prepared.url, headers=dict(prepared.headers), content=prepared.body)
    assert answer.status_code == 200, answer.text
    rows = await db.fetch("SELECT payload #>> '{}' AS body FROM jobq.jobs WHERE queue = $1", f"{WEST}:java")
    assert [r["body"] for r in rows] == [f"by {method}"]
