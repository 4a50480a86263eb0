"""Limits are enforced before work is done, with a problem body, and nothing is stored."""

import asyncio
import json

import httpx
import pytest

from tests.helpers import assert_problem

pytestmark = pytest.mark.anyio


async def test_body_over_the_limit_is_413_from_its_length(start_service, db):
    service = start_service(max_body_bytes=10_000)
    async with httpx.AsyncClient(base_url=service.url) as http:
        big = {"queue": "q", "payload": "x" * 20_000}
        assert_problem(await http.post("/jobs", json=big), 413, "payload_too_large")
        small = {"queue": "q", "payload": "x" * 100}
        assert (await http.post("/jobs", json=small)).status_code == 201
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 1


async def test_streamed_body_is_cut_off_while_it_is_read(start_service, db):
    """A chunked body with no Content-Length is refused once it passes the limit, not after it ends."""
    service = start_service(max_body_bytes=10_000)
    host, port = service.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"[" * 4096
    for _ in range(5):  # 20 KiB sent, and the body never finishes
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 413")
    writer.close()
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_nesting_deeper_than_the_limit_is_422(start_service, db):
    service = start_service(max_json_depth=8)
    async with httpx.AsyncClient(base_url=service.url) as http:
        deep = "[" * 8 + "]" * 8  # payload at depth 8 inside the body's object: 9 levels
        r = await http.post(
            "/jobs",
            content=f'{{"queue": "q", "payload": {deep}}}',
            headers={"Content-Type": "application/json"},
        )
        assert_problem(r, 422, "validation_error")
        ok = "[" * 7 + "]" * 7
        r = await http.post(
            "/jobs",
            content=f'{{"queue": "q", "payload": {ok}}}',
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 201
        # Brackets inside strings are text, not nesting.
        r = await http.post("/jobs", json={"queue": "q", "payload": "[[[[[[[[[[[[[[[[[[[[[[["})
        assert r.status_code == 201
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 2


def depth_of(value: object) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


@pytest.mark.slow
def test_nesting_depth_counts_what_the_parser_sees():
    """app.http.web.nesting_depth against the depth of the parsed value, on random JSON whose strings hold
    brackets, quotes and backslashes, at many limits: over the limit exactly when the value is."""
    import random

    from app.http.web import nesting_depth

    rng = random.Random(7)
    texts = ["a[{", 'x\\"}', "\\", '\\\\"[', ']]"', "é{", "\n[", ""]

    def value(levels: int) -> object:
        if levels == 0 or rng.random() < 0.25:
            return rng.choice([1, None, 2.5, *texts])
        if rng.random() < 0.5:
            return [value(levels - 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice(texts) + str(i): value(levels - 1) for i in range(rng.randint(0, 4))}

    for _ in range(2000):
        parsed = value(rng.randint(0, 16))
        body = json.dumps(parsed, ensure_ascii=rng.random() < 0.5).encode()
        limit = rng.randint(0, 12)
        assert (nesting_depth(body, limit) > limit) == (depth_of(parsed) > limit), (body, limit)
    # Deep, and wide and shallow, far past any limit.
    assert nesting_depth(b"[" * 100_000 + b"]" * 100_000, 64) == 65
    assert nesting_depth(b"[" + b"[]," * 50_000 + b"[]]", 64) == 2


async def test_default_nesting_limit_holds_for_absurd_depth(client, db):
    body = '{"queue": "q", "payload": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = await client.post("/jobs", content=body, headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_nan_and_infinity_are_not_json(client, db):
    for bad in ('{"queue": "q", "payload": NaN}', '{"queue": "q", "payload": [Infinity]}'):
        r = await client.post("/jobs", content=bad, headers={"Content-Type": "application/json"})
        assert_problem(r, 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0


async def test_big_integers_are_stored_exactly(client, db):
    body = '{"queue": "q", "payload": {"n": 123456789012345678901234567890}}'
    r = await client.post("/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201
    assert json.loads(r.text)["payload"]["n"] == 123456789012345678901234567890
    stored = await db.fetchval("SELECT payload->>'n' FROM jobq.all_jobs")
    assert stored == "123456789012345678901234567890"


async def test_long_error_texts_are_cut_not_refused(start_service, db):
    service = start_service(max_error_chars=100)
    async with httpx.AsyncClient(base_url=service.url) as http:
        await http.post("/jobs", json={"queue": "q", "payload": 1})
        (job,) = (await http.post("/lease", json={"queue": "q"})).json()["jobs"]
        r = await http.post(
            "/nack", json={"id": job["id"], "lease_token": job["lease_token"], "error": "e" * 5000}
        )
        assert r.status_code == 200
    assert await db.fetchval("SELECT length(last_error) FROM jobq.all_jobs") == 100
