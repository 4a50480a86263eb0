"""Numbers in what jobq stores (payloads, results, progress, schedule payloads): kept exactly as sent, or
refused with a 422 that says why; never changed on the way (1e999 made null, 1e-999 made 0.0, a long
fraction rounded to a double).

"Exactly" is what PostgreSQL's jsonb keeps of the text sent: the number's value, digit for digit
(jsonb writes 1e3 back as 1000, and 2.50 as 2.50). A number jsonb cannot hold (more than 131,072
digits before the decimal point or 16,383 after) is refused. So is a value that PostgreSQL would write
out longer than the limit that applies to it (the payload's, the result's), however short it was sent:
1e131071 is 8 characters sent and 131,072 written out, on every read and every lease.

Each body goes every way it can be read: app/http/fastpath/bodies.py's reader (`fast`), the model on the hot
dispatcher (`model`: the same body with something the fast reader leaves to the model, or an ack's
result, which only the model reads) and FastAPI's routing (`routed`). What is stored is read back from
the database and through the API.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal

import asyncpg
import httpx
import pytest

from app.core.jsontext import fits_jsonb, written_length
from tests.helpers import lease_one

pytestmark = pytest.mark.anyio

HOT = {"content-type": "application/json"}
ROUTED = {"content-type": "application/x-test+json"}  # FastAPI reads it as JSON; the hot dispatcher not

# The values, as JSON text, that must be kept exactly.
KEPT = [
    '{"big": 1e999, "tiny": 1e-999, "x": 0.30000000000000004000001}',
    "1e999",
    "-1E-999",
    "2.50",
    "-0.0",
    "1e+2",
    "[123456789012345678901234567890.12345678901234567890, 9007199254740993, 18446744073709551616]",
    "1" * 5000,  # more digits than Python turns into an int by default
    "0." + "1" * 16383,  # the most digits jsonb keeps after the point
]

# Values that write out longer than a result or progress may be (JOBQ_MAX_RESULT_BYTES, 64 KiB) and
# shorter than a payload (JOBQ_MAX_PAYLOAD_BYTES, 256 KiB): kept as payloads, refused as results.
LONG = [
    '{"n": 1e131071}',  # the most digits jsonb keeps before the point
    "[1e40000, -1.5e-16000, 2.5E+40000]",
]

# Values that write out longer than any limit, though sent in a few characters.
WRITTEN_OUT_PAST_EVERY_LIMIT = [
    "[1e131071, 1E+131071, 1e131071]",
    '{"a": -2.5e-16000, "b": 1e99999, "c": 7E+99999, "d": [1e99999]}',
]

# The values jsonb cannot hold, and so refused.
REFUSED = [
    "1e131072",
    "[1, 1e-16384]",
    '{"a": 0.' + "1" * 16384 + "}",
    "1e99999999999999999999",
]


def exact(text: str | bytes) -> object:
    """JSON decoded with every number exact, so values compare as numbers, digit for digit."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


@dataclass
class Sent:
    response: httpx.Response
    stored: Callable[[], Awaitable[str | None]]  # the value's JSON text in the database
    read: Callable[[], Awaitable[object]]  # the value read back through the API (``exact``)
    refused: Callable[[], bool]  # whether the answer refused the value


def ok(status: int) -> Callable[[httpx.Response], bool]:
    return lambda r: r.status_code == status


async def send_job(client, db, way: str, value: str, batch: bool, extra: str = "", **headers: str) -> Sent:
    extra += ', "priority": 2.0' if way == "model" else ""
    job = f'{{"queue": "q", "payload": {value}{extra}}}'
    body = f'{{"jobs": [{{"queue": "q", "payload": 1}}, {job}]}}' if batch else job
    headers |= ROUTED if way == "routed" else HOT
    r = await client.post("/jobs/batch" if batch else "/jobs", content=body, headers=headers)
    answer = exact(r.text) if r.status_code == 201 else {}
    job_id = answer["jobs"][1]["id"] if batch and answer else answer.get("id")

    async def stored() -> str | None:
        return await db.fetchval("SELECT payload::text FROM jobq.all_jobs WHERE id = $1", job_id)

    async def read() -> object:
        return exact((await client.get(f"/jobs/{job_id}")).text)["payload"]

    return Sent(r, stored, read, lambda: r.status_code == 422 and job_id is None)


async def send_keyed_job(client, db, way: str, value: str, batch: bool) -> Sent:
    """With an Idempotency-Key: the insert that keeps its answer under the key."""
    return await send_job(client, db, way, value, batch, **{"Idempotency-Key": str(uuid.uuid4())})


async def send_deduplicated_job(client, db, way: str, value: str, batch: bool) -> Sent:
    """With a dedup_key: the insert that looks for the key's holder."""
    return await send_job(client, db, way, value, batch, f', "dedup_key": "{uuid.uuid4()}"')


async def send_ack(client, db, way: str, value: str, batch: bool) -> Sent:
    await client.post("/jobs", json={"queue": "q", "payload": None})
    job = await lease_one(client)
    item = f'{{"id": {job["id"]}, "lease_token": "{job["lease_token"]}", "result": {value}}}'
    body = f'{{"items": [{item}]}}' if batch else item
    r = await client.post(
        "/ack/batch" if batch else "/ack", content=body, headers=ROUTED if way == "routed" else HOT
    )

    def refused() -> bool:
        if batch:
            return r.status_code == 200 and exact(r.text)["results"][0].get("code") == "validation_error"
        return r.status_code == 422

    return Sent(r, *_job_column(client, db, job["id"], "result"), refused)


async def send_progress(client, db, way: str, value: str, batch: bool) -> Sent:
    await client.post("/jobs", json={"queue": "q", "payload": None})
    job = await lease_one(client)
    lease = f'"id": {job["id"]}, "lease_token": "{job["lease_token"]}"'
    body = f'{{{lease}, "visibility_timeout": 60, "progress": {value}}}'
    r = await client.post("/extend", content=body, headers=ROUTED if way == "routed" else HOT)
    return Sent(r, *_job_column(client, db, job["id"], "progress"), lambda: r.status_code == 422)


def _job_column(client, db, job_id: int, column: str):
    async def stored() -> str | None:
        return await db.fetchval(f"SELECT {column}::text FROM jobq.all_jobs WHERE id = $1", job_id)

    async def read() -> object:
        return exact((await client.get(f"/jobs/{job_id}")).text)[column]

    return stored, read


_schedules = itertools.count()


async def send_schedule(client, db, way: str, value: str, batch: bool) -> Sent:
    name = f"numbers-{next(_schedules)}"
    body = f'{{"cron": "0 3 * * *", "queue": "reports", "payload": {value}}}'
    r = await client.put(f"/schedules/{name}", content=body, headers=ROUTED if way == "routed" else HOT)

    async def stored() -> str | None:
        return await db.fetchval("SELECT payload::text FROM jobq.schedules WHERE name = $1", name)

    async def read() -> object:
        return exact((await client.get(f"/schedules/{name}")).text)["payload"]

    return Sent(r, stored, read, lambda: r.status_code == 422)


# route: (send, its ways, whether it is sent as a batch, the status of an accepted one, whether its
# limit is a result's rather than a payload's)
ROUTES = {
    "POST /jobs": (send_job, ("fast", "model", "routed"), False, 201, False),
    "POST /jobs/batch": (send_job, ("fast", "model", "routed"), True, 201, False),
    "POST /jobs, Idempotency-Key": (send_keyed_job, ("fast", "model", "routed"), False, 201, False),
    "POST /jobs/batch, dedup_key": (send_deduplicated_job, ("fast", "model", "routed"), True, 201, False),
    "POST /ack": (send_ack, ("model", "routed"), False, 200, True),
    "POST /ack/batch": (send_ack, ("model", "routed"), True, 200, True),
    "POST /extend": (send_progress, ("model", "routed"), False, 200, True),
    "PUT /schedules": (send_schedule, ("routed",), False, 200, False),
}


@pytest.mark.parametrize("route", list(ROUTES))
async def test_every_number_is_kept_exactly_or_refused_saying_why(client, db, route):
    send, ways, batch, status, result_limit = ROUTES[route]
    too_long = WRITTEN_OUT_PAST_EVERY_LIMIT + (LONG if result_limit else [])
    wrong = []
    for value in KEPT + LONG + REFUSED + WRITTEN_OUT_PAST_EVERY_LIMIT:
        refusals = set()
        for way in ways:
            sent = await send(client, db, way, value, batch)
            r, case = sent.response, f"{way} {value[:60]!r}"
            answer = exact(r.text)
            if value in REFUSED or value in too_long:
                why = "PostgreSQL cannot store exactly" if value in REFUSED else "numbers written out in full"
                if not sent.refused():
                    wrong.append(f"{case}: not refused: {r.status_code} {r.text[:200]}")
                elif r.status_code == 422 and why not in answer["detail"]:
                    wrong.append(f"{case}: the refusal does not say why: {answer['detail'][:300]}")
                elif (await sent.stored()) is not None:
                    wrong.append(f"{case}: refused, yet stored")
                refusals.add(re.sub(r'(job |"id":)[0-9]+', r"\1N", r.text))  # the same but for the job
                continue
            if r.status_code != status or (route == "POST /ack/batch" and not answer["results"][0]["ok"]):
                wrong.append(f"{case}: {r.status_code} {r.text[:200]}")
                continue
            expected = await db.fetchval("SELECT $1::jsonb::text", value)
            stored = await sent.stored()
            if stored != expected:
                wrong.append(f"{case}: stored {stored[:80]!r}, sent {value[:80]!r}")
            if (await sent.read()) != exact(value):
                wrong.append(f"{case}: read back as something else")
        if len(refusals) > 1:
            wrong.append(f"{value[:60]!r}: refused in different words: {sorted(refusals)}")
    assert not wrong, "\n".join(wrong)


def number_texts() -> list[str]:
    """JSON numbers at every edge of jsonb's range: digits before and after the point, exponents."""
    fractions = [None, "0", "25", "0" * 16380 + "1", "1" * 16383, "1" * 16384]
    exponents = [None, "e-1", "e-3", "e-16383", "e-16384", "e131067", "e131068", "e131071", "E+131072"]
    exponents += ["e00000000000131071", "e1073741822", "e1073741823", "e-1073741822", "e99999999999999999999"]
    return [
        f"{sign}{whole}{'' if fraction is None else '.' + fraction}{exponent or ''}"
        for sign in ("", "-")
        for whole in ("0", "7", "9999")
        for fraction in fractions
        for exponent in exponents
    ]


def _zero_past_15s_exponents(text: str, server_version: int) -> bool:
    """A zero with an exponent of 1073741823 (INT_MAX / 2) or more, which PostgreSQL 15 refuses and 16
    holds (as 0): ``fits_jsonb`` keeps 15's rule, so both reading paths refuse it on every server."""
    mantissa, _, exponent = text.partition("e")
    return server_version >= 16 and not mantissa.strip("-0.") and abs(int(exponent)) >= 1073741823


async def test_the_range_is_postgresqls_own(db):
    """``fits_jsonb`` says what PostgreSQL's jsonb says of each number, at every edge of its range, and
    ``written_length`` how long PostgreSQL writes out each one it holds."""
    differ = []
    server_version = db.get_server_version().major
    for text in number_texts():
        try:
            written = await db.fetchval("SELECT $1::jsonb::text", text)
            held = True
        except asyncpg.DataError:
            held = False
        if held and not fits_jsonb(text) and _zero_past_15s_exponents(text, server_version):
            continue  # PostgreSQL 16 holds it; jobq refuses it on every server, as 15 does
        if fits_jsonb(text) != held:
            differ.append(f"{text[:40]}...{text[-20:]}: PostgreSQL {'holds' if held else 'refuses'} it")
        elif held and written_length(Decimal(text)) != len(written):
            differ.append(f"{text[:40]}...{text[-20:]}: written out in {len(written)} characters")
    assert not differ, "\n".join(differ)


async def test_a_payload_written_out_to_a_gigabyte_cannot_stall_its_queue(client, db):
    """9,000 copies of 1e131071 are 81 KB sent and 1.2 GB as PostgreSQL writes them out: more than it
    can write, so every lease of the queue and every read of the job would fail. Refused when sent."""
    poison = "[" + ",".join(["1e131071"] * 9000) + "]"
    r = await client.post("/jobs", content=f'{{"queue": "q", "payload": {poison}}}', headers=HOT)
    assert r.status_code == 422, r.text[:300]
    assert "numbers written out in full" in r.json()["detail"]
    await client.post("/jobs", json={"queue": "q", "payload": {"n": 1}})
    r = await client.post("/lease", json={"queue": "q", "visibility_timeout": 60})
    assert r.status_code == 200, r.text[:300]
    assert [job["payload"] for job in r.json()["jobs"]] == [{"n": 1}]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 1
