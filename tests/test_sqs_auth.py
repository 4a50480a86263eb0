"""SQS requests signed with AWS Signature Version 4 (botocore's signer) once jobq has tokens."""

from __future__ import annotations

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

CREDENTIALS = {
    "AKIAADMIN": {"secret": "admin-secret", "role": "admin"},
    "AKIAPRODUCER": {"secret": "producer-secret", "role": "producer"},
}


def client(url: str, key: str = "AKIAADMIN", secret: str = "admin-secret", **config):
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="eu-west-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, **config),
    )


@pytest.fixture
def secured(start_service):
    return start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)


def code_and_status(call, **kwargs) -> tuple[str, int]:
    with pytest.raises(ClientError) as exc:
        call(**kwargs)
    return exc.value.response["Error"]["Code"], exc.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_signed_requests_pass_and_others_are_refused(secured):
    admin = client(secured.url)
    url = admin.create_queue(QueueName="secure")["QueueUrl"]
    admin.send_message(QueueUrl=url, MessageBody="signed")
    (message,) = admin.receive_message(QueueUrl=url)["Messages"]
    admin.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    unsigned = client(secured.url, signature_version=UNSIGNED)
    assert code_and_status(unsigned.list_queues) == ("MissingAuthenticationToken", 403)
    unknown = client(secured.url, key="AKIANOBODY")
    assert code_and_status(unknown.list_queues) == ("InvalidClientTokenId", 403)
    wrong = client(secured.url, secret="not-the-secret")
    assert code_and_status(wrong.send_message, QueueUrl=url, MessageBody="x") == (
        "SignatureDoesNotMatch",
        403,
    )

    producer = client(secured.url, key="AKIAPRODUCER", secret="producer-secret")
    producer.send_message(QueueUrl=url, MessageBody="from a producer")
    assert code_and_status(producer.receive_message, QueueUrl=url) == ("AccessDenied", 403)
    assert code_and_status(producer.purge_queue, QueueUrl=url) == ("AccessDenied", 403)
    assert admin.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "from a producer"


def test_a_tampered_body_does_not_match_its_signature(secured):
    admin = client(secured.url)
    url = admin.create_queue(QueueName="tamper")["QueueUrl"]

    def tamper(request, **_):  # after signing, just before sending
        request.body = request.body.replace(b"honest", b"forged")

    admin.meta.events.register("before-send.sqs.SendMessage", tamper)
    assert code_and_status(admin.send_message, QueueUrl=url, MessageBody="honest") == (
        "SignatureDoesNotMatch",
        403,
    )


def test_without_tokens_signatures_are_not_required(service):
    unsigned = client(service.url, signature_version=UNSIGNED)
    assert unsigned.create_queue(QueueName="open")["QueueUrl"].endswith("/open")
