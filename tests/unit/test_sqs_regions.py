"""SQS regions as queue identity (app/sqs/regions.py): how a region's queues are named in jobq, their URLs and
ARNs, what a URL or ARN says, and which region a request acts in."""

from __future__ import annotations

import pytest

from app.sqs.protocol import SqsError
from app.sqs.regions import Regions, arn_parts, url_parts

TWO = Regions(("us-east-1", "eu-west-1"), strict=True)
OPEN = Regions(("us-east-1", "eu-west-1"), strict=False)
BASE = "http://jobq.example:8000/"


def test_the_default_region_keeps_jobq_names_and_others_prefix_them():
    assert TWO.queue("us-east-1", "orders") == "orders"
    assert TWO.queue("eu-west-1", "orders") == "eu-west-1:orders"
    assert TWO.split("orders") == ("us-east-1", "orders")
    assert TWO.split("eu-west-1:orders") == ("eu-west-1", "orders")
    # A jobq name with a colon that names no other served region is the default region's.
    assert TWO.split("emails:high") == ("us-east-1", "emails:high")
    assert TWO.split("ap-south-1:x") == ("us-east-1", "ap-south-1:x")
    assert TWO.split("us-east-1:x") == ("us-east-1", "us-east-1:x")
    # Names are what makes them two queues: every round trip holds.
    for region in TWO.served:
        assert TWO.split(TWO.queue(region, "orders")) == (region, "orders")


def test_urls_and_arns_name_the_region():
    assert TWO.url(BASE, "orders") == "http://jobq.example:8000/000000000000/orders"
    assert TWO.url(BASE, "eu-west-1:orders") == "http://jobq.example:8000/queue/eu-west-1/000000000000/orders"
    assert TWO.arn("orders") == "arn:aws:sqs:us-east-1:000000000000:orders"
    assert TWO.arn("eu-west-1:orders") == "arn:aws:sqs:eu-west-1:000000000000:orders"
    for queue in ("orders", "eu-west-1:orders"):
        region, name = TWO.split(queue)
        assert url_parts(TWO.url(BASE, queue)) == (None if region == TWO.default else region, name)
        assert arn_parts(TWO.arn(queue), "SourceArn") == (region, name)


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://h/000000000000/orders", (None, "orders")),
        ("http://h/prefix/000000000000/orders/", (None, "orders")),
        ("http://h/queue/eu-west-1/000000000000/orders", ("eu-west-1", "orders")),
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/orders", ("eu-west-1", "orders")),
        ("https://eu-west-1.queue.amazonaws.com/123456789012/orders", ("eu-west-1", "orders")),
        ("http://sqs.eu-west-1.localhost.localstack.cloud:4566/000000000000/orders", ("eu-west-1", "orders")),
        ("sqs.ap-south-1.amazonaws.com/1/orders", ("ap-south-1", "orders")),
        # A service's own host that merely starts with sqs. names no region.
        ("https://sqs.example.com/000000000000/orders", (None, "orders")),
        ("https://queue.amazonaws.com/123456789012/orders", (None, "orders")),
    ],
)
def test_a_url_names_its_region_where_it_says_one(url, parts):
    assert url_parts(url) == parts


@pytest.mark.parametrize(
    "arn", ["arn:aws:sns:us-east-1:0:t", "arn:aws:sqs:us-east-1:orders", "orders", 7, None]
)
def test_what_is_not_a_queue_arn_is_refused(arn):
    with pytest.raises(SqsError) as refused:
        arn_parts(arn, "deadLetterTargetArn")
    assert refused.value.code == "InvalidParameterValue"
    assert "deadLetterTargetArn" in refused.value.message


def test_a_request_acts_in_its_signed_region_else_the_one_it_names_else_the_default():
    assert TWO.of_request("eu-west-1", None) == "eu-west-1"
    assert TWO.of_request("eu-west-1", "us-east-1") == "eu-west-1"  # the signature decides
    assert TWO.of_request(None, "eu-west-1") == "eu-west-1"
    assert TWO.of_request(None, None) == "us-east-1"
    # Without keys, a region the service does not serve is read as its default one.
    assert OPEN.of_request("ap-south-1", None) == "us-east-1"
    assert OPEN.of_request(None, "ap-south-1") == "us-east-1"
    assert OPEN.served_as("ap-south-1") == "us-east-1"
    assert TWO.served_as("ap-south-1") is None


def test_list_prefixes_keep_each_region_to_its_own():
    assert TWO.prefix("eu-west-1") == ("eu-west-1:", [])
    assert TWO.prefix("us-east-1") == ("", ["eu-west-1:"])
    one = Regions(("eu-central-1",), strict=True)
    assert one.prefix("eu-central-1") == ("", [])
    assert one.queue("eu-central-1", "orders") == "orders"
    assert one.arn("orders") == "arn:aws:sqs:eu-central-1:000000000000:orders"
