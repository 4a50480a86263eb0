"""Enqueue at most once through retries: the `Idempotency-Key` header of `POST /jobs` and `/jobs/batch`
(app/service/idempotency.py, the `idempotency_keys` table), and the Python client's retries, which send one
key per call and may therefore retry an enqueue after a lost answer or a 503.

Lost answers are made for real: `LossyProxy` forwards a request to a live service, waits for the whole
answer (so the jobs are committed), then drops the connection or answers 503 as a gateway would."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import httpx
import orjson
import pytest

from app import service
from app.db.sql import QUEUE_LOCK_CLASS
from app.service.idempotency import keyed
from jobq import AsyncClient, Unavailable
from jobq.client import RetryPolicy
from tests.command_line import invoke
from tests.helpers import assert_problem, count, open_database
from tests.sent import recording
from tests.waiting import lock_waiters, until

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(attempts=10, backoff=0.01, cap=0.05)


def key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


# --- the service -----------------------------------------------------------------------------------


async def test_a_repeated_key_gets_the_first_answer_and_inserts_nothing(client, db):
    # Numbers kept exactly, a delay, the queue's max_attempts resolved at insert: all as the first time.
    body = {"queue": "mail", "payload": {"to": "ada", "n": 2**70, "x": 0.1}, "delay": 30}
    first = await client.post("/jobs", json=body, headers=key("call-1"))
    assert first.status_code == 201, first.text
    again = await client.post("/jobs", json=body, headers=key("call-1"))
    assert again.status_code == 201
    assert again.content == first.content
    assert await count(db) == 1

    batch = {"jobs": [{"queue": "mail", "payload": i, "priority": i} for i in range(5)]}
    first = await client.post("/jobs/batch", json=batch, headers=key("call-2"))
    assert first.status_code == 201
    # Meanwhile the jobs move on: the replay is still the first answer, not their state now.
    await client.post("/lease", json={"queue": "mail", "max_jobs": 10})
    again = await client.post("/jobs/batch", json=batch, headers=key("call-2"))
    assert (again.status_code, again.content) == (201, first.content)
    assert await count(db) == 6
    assert await count(db, table="idempotency_keys") == 2

    # Without the header every request is its own.
    for _ in range(2):
        assert (await client.post("/jobs", json=body)).status_code == 201
    assert await count(db) == 8


async def test_a_replayed_duplicate_is_answered_as_it_was(client, db):
    """A dedup_key duplicate (200, the holder) is replayed as first answered, holder included."""
    held = await client.post("/jobs", json={"queue": "mail", "payload": 1, "dedup_key": "ada"})
    body = {"queue": "mail", "payload": 2, "dedup_key": "ada"}
    first = await client.post("/jobs", json=body, headers=key("dup"))
    assert first.status_code == 200 and first.json()["duplicate"] and first.json()["id"] == held.json()["id"]
    await client.post("/lease", json={"queue": "mail"})  # the holder runs now
    again = await client.post("/jobs", json=body, headers=key("dup"))
    assert (again.status_code, again.content) == (200, first.content)

    batch = {
        "jobs": [
            {"queue": "mail", "payload": 3, "dedup_key": "bob"},
            {"queue": "mail", "payload": 4, "dedup_key": "ada"},  # held by the running job
            {"queue": "mail", "payload": 5, "dedup_key": "bob"},  # a repeat within the batch
            {"queue": "mail", "payload": 6},
        ]
    }
    first = await client.post("/jobs/batch", json=batch, headers=key("dup-batch"))
    assert [j["duplicate"] for j in first.json()["jobs"]] == [False, True, True, False]
    await client.post("/lease", json={"queue": "mail", "max_jobs": 10})
    again = await client.post("/jobs/batch", json=batch, headers=key("dup-batch"))
    assert (again.status_code, again.content) == (201, first.content)
    assert await count(db) == 3


async def test_a_key_reused_for_another_request_is_a_conflict(client, db):
    job = {"queue": "mail", "payload": {"to": "ada"}}
    assert (await client.post("/jobs", json=job, headers=key("k"))).status_code == 201
    other = await client.post("/jobs", json={**job, "payload": {"to": "bob"}}, headers=key("k"))
    problem = assert_problem(other, 409, "conflict")
    assert "Idempotency-Key" in problem["detail"]
    # The same job through the other route is another request too.
    assert_problem(await client.post("/jobs/batch", json={"jobs": [job]}, headers=key("k")), 409, "conflict")
    assert await count(db) == 1


async def test_kind_is_part_of_the_request(client, db):
    items = [{"queue": "mail", "payload": 1, "kind": "send_email"}, {"queue": "mail", "payload": 2}]
    first = await client.post("/jobs/batch", json={"jobs": items}, headers=key("b"))
    again = await client.post("/jobs/batch", json={"jobs": items}, headers=key("b"))
    assert first.status_code == again.status_code == 201, first.text
    assert first.content == again.content
    assert [j["kind"] for j in again.json()["jobs"]] == ["send_email", None]
    for changed in ({**items[0], "kind": "other"}, {**items[0], "kind": None}):
        response = await client.post("/jobs/batch", json={"jobs": [changed, items[1]]}, headers=key("b"))
        assert_problem(response, 409, "conflict")
    assert await count(db) == 2


def test_a_request_without_kind_hashes_as_before_kind_existed():
    """So the retry of a keyed request finds its first try's key whichever build answered either: an
    older replica during a rolling upgrade, or this one."""
    once = service.Once("", "k", "/jobs")
    request = service.NewJob("mail", {"to": "ada"}, priority=2, max_attempts=3, dedup_key="d")
    payload = '{"to":"ada"}'
    before = hashlib.sha256(orjson.dumps(["/jobs", [["mail", payload, 2, None, None, 3, "d"]]])).digest()
    assert keyed([request], [payload], once).digest == before
    assert keyed([replace(request, kind="send_email")], [payload], once).digest != before


async def test_malformed_keys_are_refused(client, db):
    for bad in ("", "x" * 256, "caf\u00e9"):
        response = await client.post(
            "/jobs", json={"queue": "q", "payload": 1}, headers={"Idempotency-Key": bad.encode("utf-8")}
        )
        assert "Idempotency-Key" in assert_problem(response, 422, "validation_error")["detail"]
    assert await count(db) == 0


async def test_keys_belong_to_the_token_that_sent_them(start_service, db):
    service = start_service(tokens={"alice": "producer", "bob": "producer"})
    body = {"queue": "mail", "payload": 1}
    async with httpx.AsyncClient(base_url=service.url) as http:
        answers = []
        for token in ("alice", "bob", "alice"):
            headers = {"Authorization": f"Bearer {token}", **key("shared")}
            response = await http.post("/jobs", json=body, headers=headers)
            assert response.status_code == 201
            answers.append(response.json()["id"])
    assert answers[0] == answers[2] != answers[1]
    assert await count(db) == 2


async def test_concurrent_requests_with_one_key_insert_once(client, db):
    """Requests with one key in flight together: the first inserts, the others wait for its commit and
    answer as it did, whether they ran as statements of their own or shared one."""
    job = {"queue": "mail", "payload": 1}

    def post() -> asyncio.Task:
        return asyncio.create_task(client.post("/jobs", json=job, headers=key("together")))

    async with db.transaction():
        # Park every keyed statement before it inserts anything.
        await db.execute(PARK)
        calls = [post()]
        await until(lambda: parked(db, 1))
        # A second statement starts while the first is in flight, with whichever of these are queued.
        calls += [post() for _ in range(11)]
        await until(lambda: parked(db, 2))
    answers = await asyncio.gather(*calls)
    assert {a.status_code for a in answers} == {201}
    assert len({a.content for a in answers}) == 1
    assert await count(db) == 1 and await count(db, table="idempotency_keys") == 1


# Park every enqueue into "mail" before it inserts anything: the queue's lock held exclusively, as SQS
# DeleteQueue takes it (app/db/sql/fragments.py, QUEUE_LOCK_CLASS), so each enqueue statement waits at its
# start.
PARK = f"SELECT pg_advisory_xact_lock({QUEUE_LOCK_CLASS}, hashtext('mail'))"


async def parked(db, expected: int) -> bool:
    """Exactly `expected` statements wait at the start (the test's transaction holds the lock)."""
    return await lock_waiters(db, "advisory") == expected


async def test_keyed_enqueues_sharing_a_statement_each_land_once(client, db):
    """Single enqueues with keys of their own share statements; sent again together with new ones, the
    repeats are answered from their keys and only the new ones are inserted."""

    async def together(keys: list[str]) -> list[httpx.Response]:
        def post(k: str) -> asyncio.Task:
            return asyncio.create_task(
                client.post("/jobs", json={"queue": "mail", "payload": k}, headers=key(k))
            )

        async with db.transaction():
            await db.execute(PARK)
            calls = [post(keys[0])]
            await until(lambda: parked(db, 1))
            calls += [post(k) for k in keys[1:]]  # these share the second statement, or later ones
            await until(lambda: parked(db, 2))
        return await asyncio.gather(*calls)

    first = await together([f"k{i}" for i in range(20)])
    assert {r.status_code for r in first} == {201}
    assert len({r.json()["id"] for r in first}) == 20
    again = await together([f"k{i}" for i in range(20)] + [f"new{i}" for i in range(5)])
    assert [r.content for r in again[:20]] == [r.content for r in first]
    assert {r.status_code for r in again[20:]} == {201}
    assert await count(db) == 25 and await count(db, table="idempotency_keys") == 25
    kept = await db.fetch("SELECT key, ids[1] AS id FROM jobq.idempotency_keys")
    by_payload = {
        r["key"]: r["id"] for r in await db.fetch("SELECT payload #>> '{}' AS key, id FROM jobq.all_jobs")
    }
    assert {r["key"]: r["id"] for r in kept} == by_payload
    # Keys kept by one statement share its created_at: some statement kept several.
    shared = "SELECT max(n) FROM (SELECT count(*) AS n FROM jobq.idempotency_keys GROUP BY created_at) s"
    assert await db.fetchval(shared) > 1


async def test_keys_expire_after_the_ttl_and_are_pruned(start_service, db):
    service = start_service(idempotency_ttl=120, prune_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as http:
        body = {"queue": "mail", "payload": 1}
        first = (await http.post("/jobs", json=body, headers=key("old"))).json()
        kept = await db.fetchval(
            "SELECT extract(epoch FROM expires_at - created_at) FROM jobq.idempotency_keys"
        )
        assert kept == 120
        # Two minutes later (the clock moved by hand): the key is forgotten, and the same key is a new call.
        await db.execute("UPDATE jobq.idempotency_keys SET expires_at = now() - interval '1 second'")
        second = await http.post("/jobs", json=body, headers=key("old"))
        assert second.status_code == 201 and second.json()["id"] != first["id"]
        assert await count(db) == 2

        # Expired keys go in the background, live ones stay.
        await db.execute("UPDATE jobq.idempotency_keys SET expires_at = now() - interval '1 second'")
        await http.post("/jobs", json=body, headers=key("live"))
        await until(lambda: db.fetchval("SELECT count(*) = 1 FROM jobq.idempotency_keys"))
        assert await db.fetchval("SELECT key FROM jobq.idempotency_keys") == "live"


async def test_pruning_goes_in_bounded_batches(database_url, db):
    insert = """
        INSERT INTO jobq.idempotency_keys
            (scope, key, request_hash, ids, max_attempts, created_at, expires_at)
        SELECT '', $1 || i, '\\x00', '{}', '{}', now(), now() + make_interval(secs => $2)
        FROM generate_series(1, $3) AS i
    """
    await db.execute(insert, "old", -1.0, 2500)
    await db.execute(insert, "live", 60.0, 1)
    statements: list[str] = []
    async with open_database(database_url, pool_max_size=1, prune_batch=1000) as database:
        async with database.acquire() as conn:  # the pool's one connection
            conn.add_query_logger(lambda record: statements.append(record.query))
        assert await service.prune_idempotency_keys(database) == 2500
    assert len([s for s in statements if "idempotency_keys" in s]) == 3  # 1000, 1000, 500
    assert await db.fetchval("SELECT array_agg(key) FROM jobq.idempotency_keys") == ["live1"]


# --- the client ------------------------------------------------------------------------------------


class LossyProxy:
    """An HTTP/1.1 proxy in front of a live service. The first `lose` requests to a path in `paths` are
    forwarded and their whole answer read (so the service has done the work), then the answer is lost:
    the connection is dropped (`mode="drop"`), or a gateway's 503 is answered instead (`mode="503"`)."""

    def __init__(self, upstream: str, *, lose: int, mode: str, paths: tuple[str, ...]) -> None:
        self.upstream = httpx.URL(upstream)
        self.lose, self.mode, self.paths = lose, mode, paths
        self.sent: list[tuple[str, str | None]] = []  # (request line, its Idempotency-Key)

    async def __aenter__(self) -> LossyProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = self._headers(head)
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                line = head.split(b"\r\n", 1)[0].decode()
                self.sent.append((line, headers.get("idempotency-key")))
                answer = await self._forward(head + body)
                if self.lose and line.split()[1] in self.paths:
                    self.lose -= 1
                    if self.mode == "drop":
                        return
                    problem = b'{"status":503,"code":"unavailable","detail":"upstream connection reset"}'
                    answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n"
                    answer += b"content-length: %d\r\n\r\n%s" % (len(problem), problem)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _headers(head: bytes) -> dict[str, str]:
        lines = head.decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}

    async def _forward(self, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(self.upstream.host, self.upstream.port)
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            return head + await reader.readexactly(int(self._headers(head).get("content-length", 0)))
        finally:
            writer.close()


@pytest.mark.parametrize("mode", ["drop", "503"])
async def test_the_client_retries_an_enqueue_whose_answer_was_lost_and_it_lands_once(service, db, mode):
    async with (
        LossyProxy(service.url, lose=1, mode=mode, paths=("/jobs", "/jobs/batch")) as proxy,
        AsyncClient(proxy.url, retry=FAST) as jobq,
    ):
        job = await jobq.enqueue("mail", {"to": "ada"})
        assert [line for line, _ in proxy.sent] == ["POST /jobs HTTP/1.1"] * 2
        assert proxy.sent[0][1] is not None and proxy.sent[0][1] == proxy.sent[1][1]  # one key per call

        proxy.lose = 1
        batch = await jobq.enqueue_many([{"queue": "mail", "payload": i} for i in range(3)])
        other = await jobq.enqueue("mail", {"to": "bob"})  # a new call: a new key
    keys = [k for _, k in proxy.sent]
    assert keys[2] == keys[3] and len({keys[0], keys[2], keys[4]}) == 3
    rows = await db.fetch("SELECT id FROM jobq.all_jobs ORDER BY id")
    assert [r["id"] for r in rows] == [job.id, *(j.id for j in batch), other.id]


async def test_jobq_enqueue_lands_once_through_a_lost_answer(service, db):
    """The `jobq enqueue` command goes through the client, and so through its retries with a key."""
    async with LossyProxy(service.url, lose=1, mode="drop", paths=("/jobs",)) as proxy:
        command = ["enqueue", "emails", '{"to": "ada"}', "--url", proxy.url]
        done = await asyncio.to_thread(invoke, command)
    assert done.exit_code == 0, done.output
    assert len(proxy.sent) == 2 and proxy.sent[0][1] is not None and proxy.sent[0][1] == proxy.sent[1][1]
    assert await count(db) == 1


@pytest.mark.parametrize("mode", ["drop", "503"])
async def test_other_calls_are_not_sent_again_once_they_may_have_been_done(service, db, mode):
    """A nack whose answer was lost, or answered by a 503 that may follow its commit, is not repeated."""
    async with AsyncClient(service.url) as direct:
        await direct.enqueue("mail", 1)
        (leased,) = await direct.lease("mail")
    async with (
        LossyProxy(service.url, lose=1, mode=mode, paths=("/nack",)) as proxy,
        AsyncClient(proxy.url, retry=FAST) as jobq,
    ):
        with pytest.raises(Unavailable):
            await jobq.nack(leased, "failed", retry_after=60)
        assert [line for line, _ in proxy.sent] == ["POST /nack HTTP/1.1"]
    assert await db.fetchval("SELECT last_error FROM jobq.all_jobs") == "failed"


async def test_a_503_saying_nothing_was_done_is_retried_even_for_a_nack(start_service, db):
    """With its one connection busy, the service answers 503 without sending anything to the database,
    and says so: then even a nack goes again."""
    service = start_service(pool_min_size=1, pool_max_size=1, pool_acquire_timeout=0.2, metrics_interval=3600)
    sent: list[str] = []

    patient = RetryPolicy(attempts=50, backoff=0.05, cap=0.1)
    async with (
        AsyncClient(service.url, retry=patient) as direct,
        AsyncClient(service.url, retry=patient, **recording(sent)) as jobq,
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        await direct.enqueue("mail", 1)
        (leased,) = await direct.lease("mail", visibility_timeout=600)
        async with db.transaction():
            await db.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")
            blocker = asyncio.create_task(direct.get_job(leased.id))  # holds the service's one connection
            await until(lambda: lock_waiters(db))
            nack = asyncio.create_task(jobq.nack(leased, "failed"))
            await until(lambda: len(sent) >= 2)
            direct_503 = await http.post("/nack", json={"id": leased.id, "lease_token": leased.lease_token})
        assert_problem(direct_503, 503, "unavailable")
        assert direct_503.json()["nothing_done"] is True
        result = await nack
        await blocker
    assert result.status == "pending"
    assert await db.fetchval("SELECT (attempts, last_error)::text FROM jobq.all_jobs") == "(1,failed)"


def test_every_client_enqueue_call_carries_a_fresh_key():
    from jobq.client import Calls

    one, two = Calls.enqueue("q", 1), Calls.enqueue("q", 1)
    assert one.headers["Idempotency-Key"] != two.headers["Idempotency-Key"]
    assert one.idempotent and Calls.enqueue_many([{"queue": "q", "payload": 1}]).idempotent
    assert Calls.enqueue("q", 1, idempotency_key="mine").headers == {"Idempotency-Key": "mine"}
