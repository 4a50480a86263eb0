"""Request bodies from strangers: credentials are checked before a byte of the body is read, on every route
that takes one, and what is read is capped before it is parsed.

A request here declares a large body and sends only its first kilobyte, then waits (with a bound) for the
answer. A service that reads the body before it checks the caller never answers it; one that checks first
answers at once. So these tests show that the body was neither read nor parsed, without timing anything.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import httpx
import pytest
from botocore.exceptions import ClientError
from fastapi.routing import iter_route_contexts

from tests.sqs.test_boto3 import sqs_client
from tests.sqs.test_query import query_client, query_model  # noqa: F401 (a fixture)

pytestmark = pytest.mark.anyio

TOKENS = {"viewer-token": "viewer", "admin-token": "admin"}
CREDENTIALS = {"AKIABODIES": {"secret": "bodies-secret", "role": "admin"}}
DECLARED = 10_000_000  # bytes the requests below say they send: under JOBQ_MAX_BODY_BYTES (16 MiB)
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def secured(start_service):
    return start_service(tokens=TOKENS, aws_credentials=CREDENTIALS, aws_regions=["us-east-1"])


async def answer_before_body(
    url: str, method: str, path: str, headers: dict[str, str], declared: int = DECLARED
) -> tuple[int, str]:
    """The status and body of the answer to a request whose body never arrives past its first kilobyte.
    With most of the body unread, the service closes the connection after its answer, rather than read
    and discard the rest."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        writer.write(head.encode() + b"a" * 1024)
        await writer.drain()
        # Bounded: a service that waits for the body would never answer.
        status_line = await asyncio.wait_for(reader.readline(), 20)
        answer_headers = {}
        while (line := await asyncio.wait_for(reader.readline(), 20)) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        body = await asyncio.wait_for(reader.readexactly(int(answer_headers["content-length"])), 20)
        assert answer_headers.get("connection") == "close"
        assert await asyncio.wait_for(reader.read(), 20) == b""
        return int(status_line.split()[1]), body.decode()
    finally:
        writer.close()


def sample_path(path: str) -> str:
    """A concrete path for a route's template: each parameter becomes a plain value."""
    path = path.replace("{account:int}", "000000000000")
    return re.sub(r"\{[^}]+\}", "x1", path)


def routes_taking_bodies(app) -> list[tuple[str, str]]:
    """Every method and path of the app that may carry a body: its POSTs, PUTs and PATCHes."""
    return sorted(
        (method, route.path)
        for route in iter_route_contexts(app.routes)
        for method in (route.methods or set()) & {"POST", "PUT", "PATCH"}
    )


async def test_every_route_refuses_a_stranger_before_reading_the_body(secured):
    routes = routes_taking_bodies(secured.app)
    assert ("PUT", "/schedules/{name}") in routes and ("PATCH", "/queues/{queue}") in routes
    assert ("POST", "/") in routes and ("POST", "/ui/jobs/selected") in routes
    asked = [(m, p, t) for m, p in routes for t in ("application/json", FORM)]
    answers = await asyncio.gather(
        *(answer_before_body(secured.url, m, sample_path(p), {"Content-Type": t}) for m, p, t in asked),
        return_exceptions=True,
    )
    wrong = {}
    for (method, path, content_type), answer in zip(asked, answers, strict=True):
        if path == "/" or path.startswith(("/{account", "/queue/")):  # SQS: the signature is missing
            expected = (403, "MissingAuthenticationToken")
        elif path == "/ui/sign-in":  # open to strangers: a body too large to be a sign-in form
            expected = (413, "payload_too_large")
        elif path == "/ui/sign-out":  # open to strangers: reads no body, ends no session it was not sent
            expected = (303, "")
        else:
            expected = (401, "unauthorized")
        if isinstance(answer, BaseException):
            wrong[method, path, content_type] = repr(answer)
        elif answer[0] != expected[0] or expected[1] not in answer[1]:
            wrong[method, path, content_type] = answer
    assert not wrong, "\n".join(f"{key}: {answer}" for key, answer in sorted(wrong.items()))


async def test_a_role_that_may_not_call_a_route_is_refused_before_the_body(secured):
    for method, path in (("PUT", "/schedules/s"), ("PATCH", "/queues/q"), ("POST", "/ui/jobs/selected")):
        headers = {"Content-Type": "application/json", "Authorization": "Bearer viewer-token"}
        status, text = await answer_before_body(secured.url, method, path, headers)
        assert status == 403 and "forbidden" in text, (path, text)


def sigv4_headers(key: str = "AKIABODIES", region: str = "us-east-1", when: datetime | None = None) -> dict:
    """SigV4 headers with a made-up signature: right in every part but the one the body decides."""
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return {
        "Content-Type": FORM,
        "X-Amz-Date": stamp,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={key}/{stamp[:8]}/{region}/sqs/aws4_request, "
        f"SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature={'0' * 64}",
    }


async def test_sqs_refuses_what_the_headers_alone_condemn_before_the_body(secured):
    """Only the signature itself needs the body (it covers the body's hash); everything else about the
    credentials is checked first."""
    expired = datetime.now(UTC) - timedelta(hours=1)
    malformed = {**sigv4_headers(), "Authorization": "AWS4-HMAC-SHA256 Credential=nonsense"}
    for headers, code in (
        (sigv4_headers(key="AKIANOBODY"), "InvalidClientTokenId"),
        (sigv4_headers(region="eu-north-1"), "SignatureDoesNotMatch"),
        (sigv4_headers(when=expired), "RequestExpired"),
        (malformed, "MissingAuthenticationToken"),
        ({**sigv4_headers(), "X-Amz-Date": "yesterday"}, "IncompleteSignature"),
    ):
        for path in ("/", "/000000000000/q"):
            status, text = await answer_before_body(secured.url, "POST", path, headers)
            assert status == 403 and f"<Code>{code}</Code>" in text, (headers, text)
        json_headers = {**headers, "Content-Type": "application/x-amz-json-1.0"}
        json_headers["X-Amz-Target"] = "AmazonSQS.ListQueues"
        status, text = await answer_before_body(secured.url, "POST", "/", json_headers)
        assert status == 403 and f"#{code}" in text, (headers, text)


# --- what is read is capped, and counted before it is parsed ----------------------------------------------


async def test_an_sqs_body_larger_than_any_sqs_request_is_refused_before_it_is_read(service):
    """No SQS request is larger than 4 MiB and a little (a 1 MiB message, percent-encoded); a larger one
    is refused from its Content-Length, in the wire format it came in."""
    declared = 5 * 1024 * 1024
    status, text = await answer_before_body(service.url, "POST", "/", {"Content-Type": FORM}, declared)
    assert status == 413 and "<Code>RequestEntityTooLarge</Code>" in text
    json_headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    status, text = await answer_before_body(service.url, "POST", "/", json_headers, declared)
    assert status == 413 and "#RequestEntityTooLarge" in text


async def test_an_sqs_body_streamed_past_the_cap_is_refused(service):
    """Without a Content-Length (chunked), the body is read until it passes the cap, then refused (it was
    read whole, up to JOBQ_MAX_BODY_BYTES, and parsed: a 200)."""

    async def chunks():
        yield b"Action=ListQueues&"
        for _ in range(80):  # 80 chunks of 64 KiB: 5 MiB
            yield b"a" * 65536

    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        try:
            answer = await http.post("/", content=chunks(), headers={"Content-Type": FORM})
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            # The service answered and closed while the client was still sending: with the rest of the
            # body unread in its socket, the close is a reset, which may reach the client before it has
            # read the answer (as with any server that stops reading a body). Refused, all the same.
            answer = None
        if answer is not None:
            assert answer.status_code == 413 and "<Code>RequestEntityTooLarge</Code>" in answer.text
        assert (await http.get("/healthz")).status_code == 200


async def test_a_query_form_with_more_fields_than_any_sqs_request_is_refused(service):
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        many = "Action=ListQueues" + "&a" * 998  # 999 fields: ignored but for the action
        assert (await http.post("/", content=many, headers={"Content-Type": FORM})).status_code == 200
        too_many = "Action=ListQueues" + "&a" * 1000
        refused = await http.post("/", content=too_many, headers={"Content-Type": FORM})
        assert refused.status_code == 400 and "<Code>MalformedQueryString</Code>" in refused.text
        assert "1001 parameters" in refused.text and "at most 1000" in refused.text
        in_the_url = await http.post(
            "/?" + "&".join(["b=1"] * 500), content=many[: 17 + 2 * 500], headers={"Content-Type": FORM}
        )
        assert in_the_url.status_code == 400 and "<Code>MalformedQueryString</Code>" in in_the_url.text


async def test_a_json_body_with_more_values_than_any_sqs_request_is_refused(service):
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        values = b'{"QueueNamePrefix": "q", "x": [' + b"[]," * 40_000 + b"[]]}"
        refused = await http.post("/", content=values, headers=headers)
        assert refused.status_code == 400 and refused.json()["__type"].endswith("#SerializationException")
        assert "more than 1000 JSON values" in refused.json()["message"]
        # Commas and brackets in strings are no values: a long prefix of them is read as any string.
        prefix = '[],{"\\' * 30_000
        listed = await http.post("/", json={"QueueNamePrefix": prefix}, headers=headers)
        assert listed.status_code == 200 and listed.json() == {}, listed.text


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_the_largest_messages_still_pass_the_caps(start_service, db, protocol, request):
    """The caps are above any valid request: a 1 MiB message of two-byte characters (3 MiB as a form or
    as JSON's \\u escapes) and a batch of ten, signed, and the same refused with a made-up signature."""
    service = start_service(aws_credentials=CREDENTIALS, aws_regions=["us-east-1"])
    keys = {"key": "AKIABODIES", "secret": "bodies-secret"}
    if protocol == "json":
        sqs = sqs_client(service.url, **keys)
    else:
        sqs = query_client(service.url, request.getfixturevalue("query_model"), *keys.values())
    url = sqs.create_queue(QueueName="large")["QueueUrl"]
    largest = "é" * (512 * 1024)  # 1 MiB in UTF-8
    sqs.send_message(QueueUrl=url, MessageBody=largest)
    tenth = "é" * (512 * 1024 // 10 - 8)
    entries = [{"Id": str(n), "MessageBody": tenth} for n in range(10)]
    assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
    lengths = await db.fetch("SELECT length(payload #>> '{}') AS n FROM jobq.all_jobs ORDER BY id")
    assert [r["n"] for r in lengths] == [len(largest)] + [len(tenth)] * 10

    if protocol == "json":
        forged = sqs_client(service.url, key="AKIABODIES", secret="not-the-secret")
    else:
        forged = query_client(service.url, request.getfixturevalue("query_model"), "AKIABODIES", "nope")
    with pytest.raises(ClientError) as exc:
        forged.send_message(QueueUrl=url, MessageBody=largest)
    assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 11


async def test_a_dashboard_form_is_capped_before_it_is_parsed(start_service, db):
    service = start_service(tokens=TOKENS)
    admin = {"Content-Type": FORM, "Authorization": "Bearer admin-token"}
    status, text = await answer_before_body(service.url, "POST", "/ui/jobs/selected", admin)
    assert status == 413 and "payload_too_large" in text and "65536" in text
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        many = "action=retry" + "&id=1" * 2000  # 10 KB, 2001 fields
        refused = await http.post("/ui/jobs/selected", content=many, headers=admin)
        assert refused.status_code == 413 and "more than 1000 fields" in refused.text
        selection = "action=retry" + "".join(f"&id={n}" for n in range(1, 501))
        pressed = await http.post("/ui/jobs/selected", content=selection, headers=admin)
        assert pressed.status_code == 303
