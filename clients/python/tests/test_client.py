"""The Python client (jobq/client.py), sync and async, against a real service and database: every call,
typed results, problems as exceptions, retries (connection errors and 503, never 4xx), bearer tokens."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
import uvicorn

import jobq as jobq_package
from app.main import create_app
from jobq import AsyncClient, Client, Conflict, JobqError, LeaseLost, NotFound, Unavailable, ValidationError
from jobq.client import (
    Calls,
    Completion,
    Failure,
    RetryPolicy,
    _Answer,
    _decode,
    _exchange,
    _Failed,
    _item_results,
    _leased,
)
from jobq.types import Forbidden, ItemResult, Job, LeasedJob, PayloadTooLarge, Unauthorized, Unreachable, load
from tests.command_line import invoke
from tests.fixtures import test_settings as settings_for
from tests.sent import recording
from tests.service_process import free_port
from tests.waiting import until

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(attempts=10, backoff=0.05, cap=0.2)


async def test_producer_calls(service, db):
    with Client(service.url) as jobq:
        job = jobq.enqueue("mail", {"to": "ada"}, priority=-5, max_attempts=3, dedup_key="ada")
        assert isinstance(job, Job) and isinstance(job.created_at, datetime)
        assert (job.queue, job.status, job.priority, job.max_attempts, job.duplicate) == (
            "mail",
            "pending",
            -5,
            3,
            False,
        )
        again = jobq.enqueue("mail", {"to": "someone else"}, dedup_key="ada")
        assert again.duplicate and again.id == job.id and again.payload == {"to": "ada"}

        later = jobq.enqueue("mail", None, delay=3600)
        assert later.payload is None and later.run_at > job.run_at + timedelta(minutes=59)
        at = datetime.now().astimezone() + timedelta(days=1)
        assert jobq.enqueue("mail", [1], run_at=at).run_at == at

        many = jobq.enqueue_many(
            [{"queue": "mail", "payload": i, "priority": i} for i in range(3)]
            + [{"queue": "mail", "payload": "dup", "dedup_key": "ada"}]
        )
        assert [j.payload for j in many] == [0, 1, 2, {"to": "ada"}]
        assert [j.duplicate for j in many] == [False, False, False, True]

        assert jobq.get_job(job.id) == jobq.get_job(job.id)
        ready = jobq.admin.run_now(later.id)
        assert ready.status == "pending" and ready.run_at < later.run_at - timedelta(minutes=59)
        with pytest.raises(Conflict):
            jobq.admin.run_now(later.id)  # due already
        assert jobq.cancel(later.id).status == "cancelled"
        with pytest.raises(Conflict) as refused:
            jobq.cancel(later.id)
        assert refused.value.status == 409 and "cancelled" in refused.value.detail
        with pytest.raises(NotFound):
            jobq.get_job(10**12)
        with pytest.raises(ValidationError) as invalid:
            jobq.enqueue("not a queue name!", 1)
        assert invalid.value.code == "validation_error" and invalid.value.problem["status"] == 422

    rows = await db.fetch("SELECT status, count(*) AS n FROM jobq.all_jobs GROUP BY status")
    assert {r["status"]: r["n"] for r in rows} == {"pending": 5, "cancelled": 1}


async def test_leased_jobs_and_ack_results_read_as_load_reads_them(service):
    """A lease's and a batch ack's answers have their own readers (client._leased, _item_results), written
    out for speed: they must give what the generic `load` gives, field for field, whatever they carry."""
    async with AsyncClient(service.url) as jobq:
        await jobq.enqueue("read", {"n": 1})
        await jobq.enqueue("read", [1, "two"], kind="send", key="k", priority=-3)
        await jobq.worker.nack(*await jobq.worker.lease("read", max_jobs=1), error="boom", retry_after=0)
        async with httpx.AsyncClient(base_url=service.url) as http:
            answer = (await http.post("/lease", json={"queue": "read", "max_jobs": 2})).json()
            first, second = answer["jobs"]
            items = [
                {"id": first["id"], "lease_token": first["lease_token"]},
                {"id": second["id"], "lease_token": "x"},
            ]
            acked = (await http.post("/ack/batch", json={"items": items})).json()
    assert any(j["last_error"] == "boom" for j in answer["jobs"])
    assert _leased(answer) == [load(LeasedJob, j) for j in answer["jobs"]]
    assert [r["ok"] for r in acked["results"]] == [True, False]
    assert _item_results(acked) == [load(ItemResult, r) for r in acked["results"]]


async def test_answers_read_exactly_as_the_json_module_reads_them(service):
    """Answers are read with orjson where it reads what Python's json module reads, and with the json
    module where it would not: an integer past 64 bits stays an int, every digit kept."""
    huge = {"big": 2**70 + 1, "negative": -(2**64) - 7, "digits": 1234567890123456789}
    plain = {"n": 1, "x": 0.1, "s": 'é \u2028 \\ "', "e": -2.5e-7, "nested": [[{}], []]}
    async with AsyncClient(service.url) as jobq:
        for payload in (huge, plain):
            job = await jobq.enqueue("exact", payload)
            assert (await jobq.get_job(job.id)).payload == payload
            (leased,) = await jobq.worker.lease("exact")
            assert leased.payload == payload
            assert type(leased.payload["n" if payload is plain else "big"]) is int
            await jobq.worker.ack(leased)
    assert _decode(b'{"n":12345678901234567890}') == json.loads(b'{"n":12345678901234567890}')
    assert type(_decode(b"[123456789012345678901]")[0]) is int
    assert _decode(b'{"a":1e400}') == {"a": float("inf")}  # orjson refuses it; json reads infinity


async def test_worker_calls(service, db):
    async with AsyncClient(service.url) as jobq:
        assert await jobq.worker.lease("work") == []
        waiting = asyncio.create_task(jobq.worker.lease("work", max_jobs=5, wait=10, worker_id="w1"))
        await asyncio.sleep(0.1)
        ids = [j.id for j in await jobq.enqueue_many([{"queue": "work", "payload": i} for i in range(4)])]
        first = await waiting
        assert first and all(isinstance(j, LeasedJob) and j.attempts == 1 for j in first)
        rest = await jobq.worker.lease("work", max_jobs=10, visibility_timeout=60)
        leased = {j.id: j for j in first + rest}
        assert sorted(leased) == ids
        a, b, c, d = (leased[i] for i in ids)

        assert (await jobq.worker.ack(a)).status == "completed"
        repeat = await jobq.worker.ack(a.id, lease_token=a.lease_token)
        assert repeat.status == "completed"  # a repeat is harmless

        nacked = await jobq.worker.nack(b, "it broke", retry_after=600)
        assert nacked.status == "pending" and nacked.run_at > datetime.now().astimezone()
        with pytest.raises(LeaseLost):
            await jobq.worker.ack(b)  # a nack ends the lease

        extended = await jobq.worker.extend(c, 3600)
        assert extended.lease_expires_at > c.lease_expires_at
        assert (await jobq.worker.nack(c, "hopeless", dead=True)).status == "dead"

        results = await jobq.worker.ack_many([d, b])
        assert [(r.id, r.ok, r.code) for r in results] == [(d.id, True, None), (b.id, False, "lease_lost")]
        with pytest.raises(NotFound):
            await jobq.worker.extend(10**12, 10, lease_token=d.lease_token)
        with pytest.raises(ValueError):
            await jobq.worker.ack(d.id)  # an id alone needs its token

    rows = await db.fetch("SELECT id, status, attempts, last_error FROM jobq.all_jobs ORDER BY id")
    assert [(r["status"], r["attempts"], r["last_error"]) for r in rows] == [
        ("completed", 1, None),
        ("pending", 1, "it broke"),
        ("dead", 1, "hopeless"),
        ("completed", 1, None),
    ]


async def test_key_on_every_job(service, db):
    from jobq import Tasks

    with Client(service.url) as jobq:
        job = jobq.enqueue("mail", 1, key="customer-42")
        assert job.key == "customer-42" and jobq.get_job(job.id).key == "customer-42"
        many = jobq.enqueue_many(
            [{"queue": "mail", "payload": 2}, {"queue": "mail", "payload": 3, "key": "b"}]
        )
        assert [j.key for j in many] == [None, "b"]
        tasks = Tasks(client=jobq)

        @tasks.task(queue="mail")
        def send(to: str) -> None: ...

        assert send.using(key="tenant-7").enqueue("ada").key == "tenant-7"
        done = invoke(["enqueue", "mail", "5", "--key", "cli", "--json", "--url", service.url])
        assert json.loads(done.stdout)["key"] == "cli"
        leased = jobq.worker.lease("mail", max_jobs=10)
        assert sorted(j.key or "-" for j in leased) == ["-", "b", "cli", "customer-42", "tenant-7"]
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE key IS NOT NULL") == 4


async def test_kind_on_every_job(service, db):
    with Client(service.url) as jobq:
        job = jobq.enqueue("mail", 1, kind="send_email")
        assert job.kind == "send_email" and jobq.get_job(job.id).kind == "send_email"
        assert jobq.enqueue("mail", 2).kind is None
        many = jobq.enqueue_many(
            [
                {"queue": "mail", "payload": 3, "kind": "resize"},
                {"queue": "mail", "payload": 4},
                {"queue": "mail", "payload": 5, "kind": "send.sms:v2", "dedup_key": "d5"},
            ]
        )
        assert [j.kind for j in many] == ["resize", None, "send.sms:v2"]
        leased = jobq.worker.lease("mail", max_jobs=10)
        assert {j.payload: j.kind for j in leased} == {
            1: "send_email", 2: None, 3: "resize", 4: None, 5: "send.sms:v2",
        }  # fmt: skip
        jobq.worker.nack(leased[0], "poison", dead=True)
        (dead,) = jobq.admin.dead_jobs("mail").jobs
        assert dead.kind == leased[0].kind
        with pytest.raises(ValidationError) as invalid:
            jobq.enqueue("mail", 6, kind="x" * 129)
        assert "kind" in invalid.value.detail
    rows = await db.fetch("SELECT kind, count(*) AS n FROM jobq.all_jobs GROUP BY kind")
    assert {r["kind"]: r["n"] for r in rows} == {"send_email": 1, "resize": 1, "send.sms:v2": 1, None: 2}


def test_kind_is_none_in_answers_without_it():
    """An answer of a service that predates kinds reads as None, not as an error."""
    leased = Calls.lease("q").read({"jobs": [LEASED_WITHOUT_KIND]})
    assert leased[0].kind is None and leased[0].id == 1
    job = Calls.get_job(1).read(JOB_WITHOUT_KIND)
    assert job.kind is None and job.duplicate is False


LEASED_WITHOUT_KIND = {
    "id": 1, "queue": "q", "payload": None, "priority": 0, "attempts": 1, "max_attempts": 5,
    "run_at": "2030-01-01T00:00:00Z", "created_at": "2030-01-01T00:00:00Z", "last_error": None,
    "lease_token": "t", "lease_expires_at": "2030-01-01T00:00:30Z",
}  # fmt: skip
JOB_WITHOUT_KIND = {
    "id": 1, "queue": "q", "status": "pending", "payload": None, "priority": 0,
    "run_at": "2030-01-01T00:00:00Z", "attempts": 0, "max_attempts": 5, "dedup_key": None,
    "last_error": None, "lease_expires_at": None, "created_at": "2030-01-01T00:00:00Z",
    "updated_at": "2030-01-01T00:00:00Z", "completed_at": None,
}  # fmt: skip


@pytest.mark.parametrize("blocking", [True, False], ids=["Client", "AsyncClient"])
async def test_nack_many_items_override_the_calls_options(service, db, blocking):
    async with AsyncClient(service.url) as jobq:
        await jobq.enqueue_many([{"queue": "work", "payload": i} for i in range(5)])
        a, b, c, d, e = sorted(await jobq.worker.lease("work", max_jobs=5), key=lambda j: j.payload)
    # (job, error) as before, then each item's own retry_after and dead, as a tuple or a Failure.
    failures = [
        (a, "default"),
        (b, "soon", 0),
        Failure(c, "dead", dead=True),
        (d, None, 7200, False),
        (e, "x"),
    ]
    if blocking:
        with Client(service.url) as sync:
            results = sync.worker.nack_many(failures, retry_after=3600)
    else:
        async with AsyncClient(service.url) as jobq:
            results = await jobq.worker.nack_many(failures, retry_after=3600)
    assert [(r.ok, r.status) for r in results] == [
        (True, "pending"), (True, "pending"), (True, "dead"), (True, "pending"), (True, "pending"),
    ]  # fmt: skip
    rows = await db.fetch(
        "SELECT status, last_error, round(extract(epoch FROM run_at - updated_at))::int AS wait"
        " FROM jobq.all_jobs ORDER BY id"
    )
    assert [(r["status"], r["last_error"]) for r in rows] == [
        ("pending", "default"), ("pending", "soon"), ("dead", "dead"), ("pending", None), ("pending", "x"),
    ]  # fmt: skip
    assert [rows[0]["wait"], rows[1]["wait"], rows[3]["wait"], rows[4]["wait"]] == [3600, 0, 7200, 3600]


def test_nack_many_items_as_sent():
    """What each item form puts in the request: the call's options where the item leaves them out."""
    job = LeasedJob(7, "q", None, 0, 1, 5, NOW, NOW, None, "t", NOW)
    call = Calls.nack_many(
        [(job, "e"), (job, None, 5), (job, "e", None, False), Failure(job, retry_after=1, dead=True)],
        retry_after=30,
        dead=True,
    )
    lease = {"id": 7, "lease_token": "t"}
    assert call.json == {
        "items": [
            lease | {"error": "e", "retry_after": 30, "dead": True},
            lease | {"retry_after": 5, "dead": True},
            lease | {"error": "e", "retry_after": 30, "dead": False},
            lease | {"retry_after": 1, "dead": True},
        ]
    }
    plain = Calls.nack_many([(job, "e")])  # as before: no retry_after, not dead
    assert plain.json == {"items": [lease | {"error": "e", "dead": False}]}


NOW = datetime(2030, 1, 1).astimezone()


@pytest.mark.parametrize("blocking", [True, False], ids=["Client", "AsyncClient"])
async def test_results_and_progress(start_service, db, blocking):
    """ack keeps a result, ack_many each item's own, extend reports progress; get_job shows them. A
    result over the limit raises PayloadTooLarge and the job is still held, for an ack without it."""
    service = start_service(max_result_bytes=100)
    async with AsyncClient(service.url) as jobq:
        ids = [j.id for j in await jobq.enqueue_many([{"queue": "work", "payload": i} for i in range(6)])]
        a, b, c, d, e, f = sorted(
            await jobq.worker.lease("work", max_jobs=6, visibility_timeout=60), key=lambda j: j.payload
        )

    def calls(client):  # the same calls, sync or async
        yield client.worker.extend(a, 60, progress={"done": 1, "of": 2})
        yield client.worker.ack(a, {"rows": 2})
        yield client.worker.ack(b.id, False, lease_token=b.lease_token)  # false is a result, not "none"
        yield client.worker.ack_many([c, Completion(d, [1, 2]), (e, "x" * 200), (f, None)])

    if blocking:
        with Client(service.url) as sync:
            answers = list(calls(sync))
            with pytest.raises(PayloadTooLarge) as too_large:
                sync.worker.ack(e, "x" * 200)
            shown = [sync.get_job(i) for i in ids]
    else:
        async with AsyncClient(service.url) as jobq:
            answers = [await call for call in calls(jobq)]
            with pytest.raises(PayloadTooLarge) as too_large:
                await jobq.worker.ack(e, "x" * 200)
            shown = [await jobq.get_job(i) for i in ids]
    assert "ack again without the result" in too_large.value.detail
    assert answers[0].id == a.id and answers[1].status == answers[2].status == "completed"
    assert [(r.ok, r.code) for r in answers[3]] == [
        (True, None),
        (True, None),
        (False, "payload_too_large"),
        (True, None),
    ]
    assert [(j.status, j.result, j.progress) for j in shown] == [
        ("completed", {"rows": 2}, {"done": 1, "of": 2}),
        ("completed", False, None),
        ("completed", None, None),
        ("completed", [1, 2], None),
        ("running", None, None),  # still held: its result was refused, twice
        ("completed", None, None),
    ]
    with Client(service.url) as sync:
        assert sync.worker.ack(e).status == "completed"
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'completed'") == 6


def test_results_as_sent():
    """What ack, ack_many and extend put in the request: a result or progress only when given."""
    job = LeasedJob(7, "q", None, 0, 1, 5, NOW, NOW, None, "t", NOW)
    lease = {"id": 7, "lease_token": "t"}
    assert Calls.ack(job).json == lease
    assert Calls.ack(job, 0).json == lease | {"result": 0}
    assert Calls.ack_many([job, Completion(job, "r"), (job, None), Completion(job)]).json == {
        "items": [lease, lease | {"result": "r"}, lease, lease]
    }
    assert Calls.extend(job, 30).json == lease | {"visibility_timeout": 30}
    assert Calls.extend(job, 30, progress=0.5).json == lease | {"visibility_timeout": 30, "progress": 0.5}


def test_result_and_progress_are_none_in_answers_without_them():
    """An answer of a service that predates results reads as None."""
    job = Calls.get_job(1).read(JOB_WITHOUT_KIND)
    assert job.result is None and job.progress is None


async def test_operator_calls(service, db):
    async with AsyncClient(service.url) as jobq:
        with pytest.raises(NotFound):
            await jobq.admin.queue("reports")
        detail = await jobq.admin.configure_queue("reports", max_attempts=1, visibility_timeout=12.5)
        assert (detail.settings.max_attempts, detail.settings.visibility_timeout) == (1, 12.5)
        for i in range(5):
            await jobq.enqueue("reports", i)
        for job in await jobq.worker.lease("reports", max_jobs=5):
            await jobq.worker.nack(job, f"failed {job.payload}")

        page = await jobq.admin.dead_jobs("reports", limit=3)
        assert [j.payload for j in page.jobs] == [4, 3, 2] and page.jobs[0].last_error == "failed 4"
        page = await jobq.admin.dead_jobs("reports", limit=3, before_id=page.next_before_id)
        assert [j.payload for j in page.jobs] == [1, 0] and page.next_before_id is None

        assert (await jobq.admin.purge_dead(page.jobs[0].id)).purged
        with pytest.raises(Conflict):
            await jobq.admin.purge_dead((await jobq.enqueue("reports", "alive")).id)
        retried = await jobq.admin.retry_dead([page.jobs[1].id])
        assert (retried.retried, retried.skipped) == (1, [])
        assert (await jobq.admin.retry_dead(queue="reports")).retried == 3

        paused = await jobq.admin.pause("reports")
        assert paused.paused and paused.pending == 5 and paused.dead == 0
        assert await jobq.worker.lease("reports") == []
        assert not (await jobq.admin.resume("reports")).paused
        (row,) = await jobq.admin.queues()
        assert (row.queue, row.pending, row.running, row.dead) == ("reports", 5, 0, 0)
        assert row.oldest_pending_age_seconds >= 0

    counts = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'pending') AS pending, count(*) AS total FROM jobq.all_jobs"
    )
    assert (counts["pending"], counts["total"]) == (5, 5)


async def test_payload_too_large(start_service, db):
    service = start_service(max_payload_bytes=100)
    with Client(service.url) as jobq:
        jobq.enqueue("big", "x" * 50)
        with pytest.raises(PayloadTooLarge) as too_large:
            jobq.enqueue("big", "x" * 200)
        assert too_large.value.status == 413
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 1


def _counting() -> tuple[list[str], dict]:
    sent: list[str] = []
    return sent, recording(sent)


async def test_retries_connection_errors_until_the_service_is_up(database_url, db):
    port = free_port()
    config = uvicorn.Config(
        create_app(settings_for(database_url)), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    starter = threading.Thread(target=server.run)
    sent, hooks = _counting()
    try:
        patient = RetryPolicy(attempts=50, backoff=0.05, cap=0.2)
        async with AsyncClient(f"http://127.0.0.1:{port}", retry=patient, **hooks) as jobq:
            # No dedup_key: only safe because nothing got through.
            enqueue = asyncio.create_task(jobq.enqueue("late", "hello"))
            await until(lambda: len(sent) >= 2)  # refused twice, nothing listening yet: started now
            starter.start()
            job = await enqueue
        assert len(sent) > 2 and set(sent) == {"POST /jobs"}
    finally:
        if starter.ident is not None:  # started
            await until(lambda: server.started)
            server.should_exit = True
            starter.join(10)
    assert await db.fetchval("SELECT array_agg(id) FROM jobq.all_jobs") == [job.id]

    with Client(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=3, backoff=0.01)) as nobody:
        with pytest.raises(Unreachable) as unreachable:
            nobody.admin.queues()
        assert isinstance(unreachable.value, Unavailable) and unreachable.value.status is None


async def test_retries_503_but_never_4xx(start_service, db):
    service = start_service(statement_timeout=0.3)
    sent, hooks = _counting()
    async with AsyncClient(service.url, retry=FAST, **hooks) as jobq:
        # Hold the table: the service's statements time out and it answers 503 until the lock goes.
        transaction = db.transaction()
        await transaction.start()
        await db.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")
        enqueue = asyncio.create_task(jobq.enqueue("locked", "patient"))
        await until(lambda: len(sent) >= 3)
        await transaction.rollback()
        job = await enqueue
        assert len(sent) >= 3 and job.status == "pending"

        sent.clear()
        with pytest.raises(NotFound):
            await jobq.get_job(10**12)
        with pytest.raises(ValidationError):
            await jobq.worker.lease("locked", max_jobs=0)
        (leased,) = await jobq.worker.lease("locked")
        await jobq.worker.ack(leased)
        with pytest.raises(LeaseLost):
            await jobq.worker.nack(leased, "too late")
        assert len(sent) == 5  # one request per call: 4xx answers are not retried

    # With retries exhausted, the 503 itself comes out.
    transaction = db.transaction()
    await transaction.start()
    await db.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")
    with Client(service.url, retry=RetryPolicy(attempts=2, backoff=0.01, cap=0.01)) as jobq:
        with pytest.raises(Unavailable) as unavailable:
            jobq.enqueue("locked", "impatient")
    await transaction.rollback()
    assert unavailable.value.status == 503 and unavailable.value.code == "unavailable"
    assert await db.fetchval("SELECT array_agg(payload #>> '{}') FROM jobq.all_jobs") == ["patient"]


def test_retry_policy_after_lost_answers():
    """An answer lost after the request went out, or a 503 that may follow a commit: idempotent calls go
    again (an enqueue is one: it carries an Idempotency-Key, the same on every try), the others do not,
    unless the request surely was not carried out. The policy is I/O-free, so it is driven here by hand."""
    lost = _Failed(ConnectionResetError("connection reset"), not_sent=False)

    def answer(status: int, body: object) -> _Answer:
        return _Answer(status, "", {}, body if isinstance(body, bytes) else json.dumps(body).encode())

    ok = answer(201, {"id": 1, "status": "completed"})
    unavailable = answer(503, {"code": "unavailable"})
    nothing_done = answer(503, {"code": "unavailable", "nothing_done": True})
    gateway = answer(502, b"bad gateway")

    def goes_again(call, outcome) -> bool:
        steps = _exchange(call, RetryPolicy())
        assert next(steps) is call
        try:
            pause = steps.send(outcome)
        except (JobqError, StopIteration):  # the answer's error (Unreachable, Unavailable, ...)
            return False
        assert isinstance(pause, float) and steps.send(None) is call  # a pause, then the same call
        return True

    enqueue, batch = Calls.enqueue("q", 1), Calls.enqueue_many([{"queue": "q", "payload": 1}])
    nack = Calls.nack(1, "e", lease_token="t")
    for outcome in (lost, unavailable, nothing_done, gateway):
        assert goes_again(enqueue, outcome) and goes_again(batch, outcome)
        assert goes_again(Calls.ack(1, lease_token="t"), outcome)
    for outcome in (lost, unavailable, gateway):
        assert not goes_again(nack, outcome)
        assert not goes_again(Calls.cancel(1), outcome)
        assert not goes_again(Calls.retry_dead(queue="q"), outcome)
    refused = _Failed(ConnectionRefusedError("refused"), not_sent=True)  # never sent: anything goes again
    for call in (enqueue, nack, Calls.purge_dead(1)):
        assert goes_again(call, refused) and goes_again(call, nothing_done)

    steps = _exchange(Calls.ack(1, lease_token="t"), RetryPolicy())
    next(steps)
    steps.send(lost)
    steps.send(None)
    with pytest.raises(StopIteration) as done:
        steps.send(ok)
    assert done.value.value.status == "completed"


TOKENS = {"producer-token": "producer", "worker-token": "worker", "admin-token": "admin"}


async def test_bearer_token(start_service, db, monkeypatch):
    service = start_service(tokens=TOKENS)
    with Client(service.url, retry=FAST) as anonymous:
        with pytest.raises(Unauthorized) as unauthorized:
            anonymous.enqueue("secret", 1)
        assert unauthorized.value.status == 401
    with Client(service.url, token="producer-token") as producer:
        job = producer.enqueue("secret", 1)
        with pytest.raises(Forbidden) as forbidden:
            producer.worker.lease("secret")
        assert forbidden.value.status == 403 and forbidden.value.code == "forbidden"
    monkeypatch.setenv("JOBQ_TOKEN", "worker-token")
    monkeypatch.setenv("JOBQ_URL", service.url)
    async with AsyncClient() as client:
        assert client.url == service.url
        (leased,) = await client.worker.lease("secret")
        await client.worker.ack(leased)
        with pytest.raises(Forbidden):
            await client.admin.queues()
    assert leased.id == job.id
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job.id) == "completed"


@pytest.mark.parametrize("blocking", [True, False], ids=["Client", "AsyncClient"])
async def test_a_netrc_naming_the_host_does_not_come_between_the_token_and_the_service(
    start_service, db, monkeypatch, tmp_path, blocking
):
    """The clients take their proxy from the environment, as curl and requests do, and nothing else: a
    ~/.netrc with credentials for the service's host once made every call with a token fail (aiohttp
    refuses a request with both an Authorization header and netrc credentials)."""
    service = start_service(tokens=TOKENS)
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password elsewhere\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path))
    if blocking:
        with Client(service.url, token="producer-token", retry=FAST) as producer:
            job = producer.enqueue("secret", 1)
    else:
        async with AsyncClient(service.url, token="producer-token", retry=FAST) as producer:
            job = await producer.enqueue("secret", 1)
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job.id) == "pending"


async def queues_of(url: str, blocking: bool) -> None:
    """`admin.queues()` through a client of each kind; the blocking one on a thread, so that this test's
    event loop, where the test's proxy runs, goes on."""
    if blocking:

        def queues() -> None:
            with Client(url, retry=FAST) as client:
                client.admin.queues()

        await asyncio.to_thread(queues)
    else:
        async with AsyncClient(url, retry=FAST) as client:
            await client.admin.queues()


@pytest.mark.parametrize("blocking", [True, False], ids=["Client", "AsyncClient"])
async def test_the_clients_go_through_the_proxy_the_environment_names(start_service, monkeypatch, blocking):
    """HTTP_PROXY sends the calls through the proxy (absolute-form request lines), NO_PROXY exempts a host,
    and a proxy given to the session wins over the environment's."""
    service = start_service()
    seen: list[bytes] = []
    upstream = urlsplit(service.url)

    async def message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        """One HTTP/1.1 message: its head and its body (by Content-Length, as the service sends them)."""
        head = await reader.readuntil(b"\r\n\r\n")
        fields = [line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line]
        length = next((int(value) for name, value in fields if name.strip().lower() == b"content-length"), 0)
        return head, await reader.readexactly(length)

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A proxy for plain HTTP: each request line noted, the request passed on in origin form."""
        up_reader, up_writer = await asyncio.open_connection(upstream.hostname, upstream.port)
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                head, body = await message(reader)
                line, rest = head.split(b"\r\n", 1)
                seen.append(line)
                method, target, version = line.split(b" ")
                up_writer.write(b" ".join((method, urlsplit(target.decode()).path.encode(), version)))
                up_writer.write(b"\r\n" + rest + body)
                head, body = await message(up_reader)
                writer.write(head + body)
        up_writer.close()
        writer.close()

    proxy = await asyncio.start_server(forward, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    async with proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        await queues_of(service.url, blocking)
        assert seen == [f"GET {service.url}/queues HTTP/1.1".encode()]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        await queues_of(service.url, blocking)
        assert len(seen) == 1
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing listens there
        monkeypatch.delenv("NO_PROXY")
        async with AsyncClient(service.url, retry=FAST, proxy=f"http://127.0.0.1:{port}") as client:
            await client.admin.queues()
        assert len(seen) == 2


# --- the blocking client's own event loop ----------------------------------------------------------


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "jobq-client"}


def test_a_client_starts_its_thread_at_its_first_request_and_close_ends_it(service):
    before = loop_threads()
    jobq = Client(service.url)
    assert loop_threads() == before  # made, not yet used: no thread
    job = jobq.enqueue("loop", 1)
    (thread,) = loop_threads() - before
    assert thread.daemon and jobq.get_job(job.id).id == job.id and loop_threads() - before == {thread}
    jobq.close()
    assert not thread.is_alive() and thread not in threading.enumerate()
    jobq.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="closed"):
        jobq.get_job(job.id)
    with Client(service.url):  # never used: closing starts nothing and ends nothing
        pass
    assert loop_threads() == before


def test_a_client_dropped_without_close_ends_its_thread(service):
    """The thread holds the loop, not the client: a client nobody closed is collected, and its loop ends."""
    before = loop_threads()
    jobq = Client(service.url)
    jobq.admin.queues()
    (thread,) = loop_threads() - before
    del jobq
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


async def test_threads_share_one_client(service, db):
    """Many threads at once on one client, as on one httpx.Client before: every call answered, to its
    own caller."""
    with Client(service.url) as jobq:

        def enqueue_and_read(thread: int) -> list[int]:
            ids = []
            for i in range(50):
                job = jobq.enqueue("shared", [thread, i])
                assert job.payload == [thread, i]
                ids.append(job.id)
            return ids

        with ThreadPoolExecutor(8) as threads:
            ids = [i for some in threads.map(enqueue_and_read, range(8)) for i in some]
    assert len(ids) == len(set(ids)) == 400
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE queue = 'shared'") == 400
    assert sorted(await db.fetchval("SELECT array_agg(id) FROM jobq.all_jobs")) == sorted(ids)


def test_a_forked_child_uses_the_client_of_its_parent(service):
    """The child of a fork has the parent's client but not its loop's thread: it starts its own, and the
    parent's client goes on working in the parent."""
    with Client(service.url) as jobq:
        before = jobq.enqueue("forked", "parent")  # the parent's loop is running
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child; it reports through the pipe and exits
            code = 1
            try:
                signal.alarm(30)  # a child that hangs is ended, and the parent reads no id
                os.close(reader)
                job = jobq.enqueue("forked", "child")
                os.write(writer, str(job.id).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        with os.fdopen(reader, "rb") as pipe:
            written = pipe.read()
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and written
        job = jobq.get_job(int(written))
        assert (job.queue, job.payload, job.status) == ("forked", "child", "pending")
        assert jobq.get_job(before.id).payload == "parent"


async def test_a_client_made_and_used_in_a_running_event_loop(service):
    """Sync code in a program that runs an event loop: the client's requests run on its own loop, so a
    call made from the loop's thread (blocking it meanwhile) or from a thread of `asyncio.to_thread`
    works."""
    with Client(service.url) as jobq:
        job = jobq.enqueue("in-a-loop", 1)
        assert (await asyncio.to_thread(jobq.get_job, job.id)).id == job.id
        again = await asyncio.to_thread(jobq.enqueue, "in-a-loop", 2)
        assert [j.id for j in jobq.worker.lease("in-a-loop", max_jobs=5)] == [job.id, again.id]

    def made_in_a_thread() -> int:
        with Client(service.url) as other:
            return other.enqueue("in-a-loop", 3).id

    assert (await asyncio.to_thread(made_in_a_thread)) > again.id


def test_timeouts_and_retries_of_the_blocking_client(service):
    """`timeout` bounds each wait for an answer, a long-poll's `wait` added; an answer lost to it is tried
    again for an idempotent call, and not for the others, as before."""
    with socket.socket() as silent:  # accepts connections (its backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        sent, hooks = _counting()
        retry = RetryPolicy(attempts=3, backoff=0.01, cap=0.01)
        with Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.2, retry=retry, **hooks) as jobq:
            started = time.monotonic()
            with pytest.raises(Unreachable, match="GET /jobs/1: .*Timeout"):
                jobq.get_job(1)
            assert sent == ["GET /jobs/1"] * 3 and 0.6 <= time.monotonic() - started < 5
            sent.clear()
            with pytest.raises(Unreachable):
                jobq.cancel(1)  # the request may have been carried out: not sent again
            assert sent == ["DELETE /jobs/1"]
    with Client(service.url, timeout=0.2) as jobq:
        started = time.monotonic()
        assert jobq.worker.lease("empty", wait=1) == []  # a second's long-poll, past the timeout
        assert time.monotonic() - started >= 0.9


async def test_a_client_s_connector_is_a_function_that_makes_one(service):
    """A connector belongs to an event loop; the blocking client makes its session in a loop of its own
    (and again after a fork), so it takes a function that makes the connector, not one made."""
    with Client(service.url, connector=lambda: aiohttp.TCPConnector(limit=1)) as jobq:
        with ThreadPoolExecutor(4) as threads:  # one connection, taken in turn
            jobs = list(threads.map(lambda i: jobq.enqueue("one-connection", i), range(8)))
        assert sorted(j.payload for j in jobs) == list(range(8))
    made = aiohttp.TCPConnector()  # in this test's event loop
    with pytest.raises(TypeError, match="a function that makes the connector"):
        Client(service.url, connector=made)
    await made.close()


def test_the_client_package_does_without_httpx():
    """Both clients are on aiohttp: no module of the package imports httpx, at its top or in a function,
    and importing them all loads none of it."""
    package = Path(jobq_package.__file__).parent
    modules = sorted(path for path in package.glob("*.py") if path.stem != "__main__")
    for module in modules:
        assert not re.search(r"^\s*(import|from) httpx\b", module.read_text(), re.M), module.name
    names = ", ".join(f"jobq.{path.stem}" for path in modules if path.stem != "__init__")
    check = f"import sys, {names}; assert 'httpx' not in sys.modules, 'httpx was imported'"
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)
